"""The consumer facade: AsyncConsumer (on one event loop) and the sync Consumer over a private loop.

The work is split as Kafka's consumer splits it: `subscription_state` (SubscriptionState: the
assignment, consumed and fetch positions, paused partitions, the reset strategy), `fetcher`
(Fetcher: prefetching long polls per leader into a bounded buffer, decoded by `decoder`),
`consumer_coordinator` (ConsumerCoordinator: subscription, assignors, commits, and the rebalance
choreography with its callbacks, over `group_membership`'s GroupMembership: join, sync,
heartbeats, leave) and `offset_fetcher` (OffsetFetcher: ListOffsets, and committed offsets or
resets turned into positions). This module wires
them through their constructors and drives a poll: the coordinator's steps on the application's
thread (rebalance callbacks), then the records the fetcher buffered.

`poll_arrow()` returns one pyarrow Table (schema `RECORD_SCHEMA`); `poll()` returns
`ConsumerRecord`s built from the same table. An out-of-range position is reset per
`auto_offset_reset` ("earliest", "latest") or raised ("none").

A batch that fails the checks costs nothing that precedes it: every intact record before it
(and other partitions' records) is returned first, `position()` moves to the bad batch, and the
next poll raises `CorruptRecordError` with its topic, partition, `offset` (the position) and
`last_offset` (the bad batch's last offset when its header is intact), so that a
skip-and-continue loop can `seek(last_offset + 1)` past exactly that batch. A broker's non-retriable error for a
partition (e.g. CORRUPT_MESSAGE from a damaged log) is delivered the same way, as Kafka's
fetcher does: after the partition's records fetched before it, while the other partitions go on.

Consumer groups. With `group_id`, `subscribe(topics)` (or `pattern=`) lets the group's
coordinator share the topics' partitions among its members (`client.consumer_coordinator`
keeps the membership: join, sync, background heartbeats); `assign()` instead reads fixed
partitions and still commits to the group. The two are mutually exclusive. A newly assigned
partition starts at the group's committed offset, else per `auto_offset_reset`. A position is
always the next record to consume, and so is a committed offset.

  - Rebalances happen inside `poll`: eager assignors (range, roundrobin) revoke everything before
    rejoining; when every assignor is cooperative (cooperative-sticky) the consumer keeps its
    partitions, consumes them during the rebalance, and revokes only those that move (then
    rejoins at once, so the follow-up rebalance can place them). Callbacks `on_revoke`,
    `on_assign` and `on_lost` get a sorted list of partitions and run on the application's
    thread inside `poll` (and `unsubscribe`/`close`), never on the I/O thread, so they may call
    the consumer (seek, commit, position). An AsyncConsumer's callbacks may be coroutine
    functions. `on_lost` (default: `on_revoke`) means the partitions are already someone else's:
    the session expired, the member was fenced, or it left after `max_poll_interval_ms`; a commit
    for them would be refused. Under the cooperative protocol `on_revoke` runs after the new
    generation began; the broker still accepts commits of the revoked partitions then, because
    nobody owns them until the follow-up rebalance.
  - Heartbeats run on the consumer's event loop, independent of the application: a sync
    Consumer keeps its membership however slow the processing between polls, up to
    `max_poll_interval_ms`; past that it leaves the group and rejoins at its next poll. An
    AsyncConsumer heartbeats on its caller's loop: a step that blocks that loop for longer than
    `session_timeout_ms` loses the membership.
  - Static membership (`group_instance_id`): `close()` does not leave the group, so a restart
    within `session_timeout_ms` gets the same partitions back without a rebalance.

Delivery semantics:
  - at least once (the default): `enable_auto_commit` commits the positions of records `poll`
    returned only at a later poll (every `auto_commit_interval_ms`), before a rebalance revokes
    partitions and at `close()`; so a record is committed only after the application came back
    for more, and records returned but not processed before a crash are delivered again;
  - at most once: `enable_auto_commit=False` and `commit()` right after `poll`, before processing;
  - exactly once: through transactions (not yet).
`commit()` commits the current positions (or the offsets given) and waits; `commit_async()` does
not wait, never retries (a retry could land after a later commit and move the offset back) and
hands its outcome to a callback at the next poll. A `seek` is explicit: what was sought is what
the next commit commits.

Thread safety: one application thread polls a Consumer (as in Kafka); its other methods may be
called from that thread, including from inside the callbacks.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Iterable, Iterator

import pyarrow as pa

from client.assignors import ASSIGNORS, DEFAULT_ASSIGNORS
from client.cluster import Cluster
from client.config import BootstrapServers, as_bool, assignor_names, client_settings
from client.consumer_coordinator import (
    CommitCallback,
    ConsumerCoordinator,
    GroupMetadata,
    RebalanceCallback,
    RebalanceListener,
)
from client.decoder import RECORD_SCHEMA, ConsumerRecord, FetchedBatch, fetched_to_records, to_record_batch
from client.fetcher import Fetcher
from client.loop_thread import LoopThread
from client.offset_fetcher import OffsetFetcher
from client.retry import Retry, retriable
from client.steps import OnLoop, OnThread, Poller, Steps, run_blocking, run_steps
from client.subscription_state import RESET_ALIASES, RESET_STRATEGIES, SubscriptionState
from common.errors import ConsumerStoppedError, OffsetOutOfRangeError, PymqError
from common.topic_partition import TopicPartition
from protocol import ISOLATION_LEVELS
from segment_format import batch_body

log = logging.getLogger("pymq.consumer")

class AsyncConsumer:
    """The consumer core; use on one event loop (`Consumer` wraps it for threads).

    Group settings (Kafka's names and defaults): `group_id` (None: no group; `subscribe` and
    `commit` need one), `group_instance_id` (static membership), `session_timeout_ms`,
    `heartbeat_interval_ms` (below the session timeout), `max_poll_interval_ms` (also the
    rebalance timeout the coordinator waits for members to rejoin), `partition_assignment_strategy`
    (assignor names in preference order, or Kafka's class names), `enable_auto_commit` (default:
    True with a group), `auto_commit_interval_ms`, `metadata_max_age_ms` (how often a pattern
    subscription looks for new topics), `client_id`, `allow_auto_create_topics` (a lookup of a named
    topic asks the broker to create it; off unlike Kafka's consumer: a reader's typo creates nothing),
    `isolation_level` (read_uncommitted, Kafka's default, or read_committed: records of open
    transactions are not returned yet, those of aborted ones never). Every setting:
    docs/client-settings.md."""

    def __init__(self, bootstrap_servers: str | list[str], *, auto_offset_reset: str = "latest",
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1, fetch_max_bytes: int = 50 << 20,
                 max_partition_fetch_bytes: int = 8 << 20, max_buffer_bytes: int = 64 << 20,
                 check_crcs: bool = True, request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 group_id: str | None = None, group_instance_id: str | None = None, client_id: str = "pymq-consumer",
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3_000,
                 max_poll_interval_ms: int = 300_000,
                 partition_assignment_strategy: str | Sequence[str] = DEFAULT_ASSIGNORS,
                 enable_auto_commit: bool | str | None = None, auto_commit_interval_ms: int = 5_000,
                 metadata_max_age_ms: int = 300_000, max_poll_records: int | None = None,
                 allow_auto_create_topics: bool = False, isolation_level: str = "read_uncommitted") -> None:
        auto_offset_reset = RESET_ALIASES.get(auto_offset_reset, auto_offset_reset)
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', got {isolation_level!r}")
        if auto_offset_reset not in RESET_STRATEGIES:
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none' (or Kafka's older "
                             f"'smallest', 'largest'), got {auto_offset_reset!r}")
        if max_poll_records is not None and max_poll_records <= 0:
            raise ValueError(f"max_poll_records must be positive (None: no limit), got {max_poll_records}")
        self.max_poll_records = max_poll_records
        if group_id is not None and not group_id:
            raise ValueError("group_id must not be empty (None: no group)")
        if group_id is None and group_instance_id is not None:
            raise ValueError("group_instance_id needs a group_id")
        auto_commit = group_id is not None if enable_auto_commit is None else as_bool("enable.auto.commit", enable_auto_commit)
        if auto_commit and group_id is None:
            raise ValueError("enable_auto_commit needs a group_id: offsets are committed to a group")
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be positive and below "
                             f"session_timeout_ms ({session_timeout_ms})")
        for name, value in (("max_poll_interval_ms", max_poll_interval_ms), ("auto_commit_interval_ms",
                            auto_commit_interval_ms), ("metadata_max_age_ms", metadata_max_age_ms)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        strategies = assignor_names(partition_assignment_strategy, ASSIGNORS)
        self.enable_auto_commit = auto_commit
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                               auto_create_topics=as_bool("allow.auto.create.topics", allow_auto_create_topics))
        self._subs = SubscriptionState(auto_offset_reset)
        self._fetcher = Fetcher(self.cluster, self._subs, fetch_max_wait_ms=fetch_max_wait_ms,
                                fetch_min_bytes=fetch_min_bytes, fetch_max_bytes=fetch_max_bytes,
                                max_partition_fetch_bytes=max_partition_fetch_bytes, max_buffer_bytes=max_buffer_bytes,
                                check_crcs=check_crcs, request_timeout_s=request_timeout_ms / 1000,
                                retry_backoff_s=retry_backoff_ms / 1000, isolation_level=ISOLATION_LEVELS[isolation_level])
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._closed = False
        self._poller: Poller = OnLoop()
        self._coordinator: ConsumerCoordinator | None = None
        if group_id is not None:
            self._coordinator = ConsumerCoordinator(
                self.cluster, self._subs, self._fetcher, group_id, group_instance_id=group_instance_id,
                client_id=client_id, session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
                max_poll_interval_ms=max_poll_interval_ms, assignors=strategies, request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms, metadata_max_age_ms=metadata_max_age_ms,
                enable_auto_commit=auto_commit, auto_commit_interval_ms=auto_commit_interval_ms,
                init_positions=self._init_positions)
        self._offsets = OffsetFetcher(self.cluster, self._subs,
                                      self._coordinator.fetch_committed if self._coordinator is not None else None,
                                      ISOLATION_LEVELS[isolation_level])

    async def start(self) -> "AsyncConsumer":
        self._fetcher.start(asyncio.get_running_loop())
        batch_body.warm_up()
        await self.cluster.refresh()
        return self

    def poll_from(self, poller: Poller) -> None:
        """Who polls: by default a coroutine on this consumer's loop; the sync Consumer makes it
        its application thread (`steps.OnThread`), and then runs `poll_batches`, `unsubscribe`,
        `lookup_position` and `close` on that thread with `steps.run_blocking`: rebalance and
        commit callbacks run there, the loop's part of the work goes through its LoopThread."""
        self._poller = poller

    @property
    def closed(self) -> bool:
        return self._closed

    # -- assignment and positions ----------------------------------------------------------------

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (no group rebalancing; `assign([])` stops). New ones
        start at the group's committed offset (with a group_id), else per auto_offset_reset,
        unless sought. Raises ValueError while subscribed."""
        wanted = list(dict.fromkeys((t, int(p)) for t, p in partitions))
        for topic, partition in wanted:
            await self.cluster.leader(topic, partition)  # raises for unknown topics/partitions
        with self._subs.lock:  # raises ValueError while subscribed
            self._fetcher.assignment_changed(self._subs.assign_from_user(wanted))
        # A retriable failure (a leader that has not applied a new topic yet and answers
        # UNKNOWN_TOPIC_OR_PARTITION, a leader moving) is retried for up to request_timeout_ms:
        # the partitions are known, only their start positions are not yet.
        retry = Retry(self._retry_backoff_s, self.cluster.request_timeout_s)
        while True:
            try:
                await self._init_positions([tp for tp in wanted if not self._subs.has_valid_position(tp)])
                break
            except PymqError as err:
                if not retriable(err):
                    raise
                await retry.back_off(err)  # raises `err` once the time is up
        self._fetcher.invalidate()

    def assignment(self) -> list[TopicPartition]:
        """The partitions this consumer reads now (assigned by hand or by its group)."""
        return self._subs.assigned_partitions()

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the next record `poll` returns for `tp`."""
        self._subs.require_assigned(tp)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        self._subs.seek(tp, offset)
        self._fetcher.invalidate()

    async def pause(self, *tps: TopicPartition) -> None:
        """Stop fetching these partitions and returning their records (they stay assigned, and
        in the group, and keep their positions) until `resume`. Buffered records of them are
        dropped and fetched again after resume."""
        with self._subs.lock:
            self._subs.pause(tps)
            self._fetcher.drop_buffered(set(tps))
        self._fetcher.replan()

    async def resume(self, *tps: TopicPartition) -> None:
        """Fetch and return these paused partitions again."""
        self._subs.resume(tps)
        self._fetcher.ensure_fetchers()
        self._fetcher.replan()

    def paused(self) -> list[TopicPartition]:
        return self._subs.paused_partitions()

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._offsets.reset_positions(list(tps) or self._subs.assigned_partitions(), "earliest")
        self._fetcher.invalidate()

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._offsets.reset_positions(list(tps) or self._subs.assigned_partitions(), "latest")
        self._fetcher.invalidate()

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record `poll` will return for `tp` (not how far prefetch got).
        A partition the group just assigned gets its position (its committed offset) during the
        poll that assigned it, after on_assign: asked before that, this raises (the sync
        Consumer's `position` looks it up instead)."""
        return self._subs.position(tp)

    async def lookup_position(self, tp: TopicPartition) -> int:
        """`position(tp)`, looking up first the start position of a partition the group just
        assigned whose committed offset is not known yet (asked inside on_assign), as Kafka's
        position() does."""
        if self._subs.is_initializing(tp):
            await self._poller.run(self._init_positions([tp]))
        return self.position(tp)

    async def rewind(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Move the position of each assigned partition in `offsets` back to its offset where the
        position is past it: records a poll returned that the application did not consume."""
        for tp, offset in offsets.items():
            if self._subs.has_valid_position(tp) and self._subs.position(tp) > offset:
                await self.seek(tp, offset)

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, (offset, timestamp) of the first record at or after the time, or None."""
        return await self._offsets.offsets_for_times(timestamps)

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._offsets.beginning_offsets(tps)

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._offsets.end_offsets(tps)

    async def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        return await self._offsets.list_offsets(timestamps)

    async def _init_positions(self, tps: list[TopicPartition]) -> None:
        """Start positions for assigned partitions without one (`OffsetFetcher.initialize_positions`:
        the group's committed offset, else per auto_offset_reset; with "none", none: poll raises
        NoOffsetForPartitionError until a seek), then fetch them."""
        await self._offsets.initialize_positions(tps)
        self._fetcher.ensure_fetchers()
        self._fetcher.replan()

    # -- polling ---------------------------------------------------------------------------------

    async def poll_arrow(self, timeout_ms: int = 1000, max_records: int | None = None) -> pa.Table:
        """Fetched records as one Arrow table (possibly empty after `timeout_ms`).

        A corrupt batch: the records before it (and other partitions' records) are returned
        first and the partition's position moves to the bad batch; the next call raises
        CorruptRecordError naming topic, partition, offset and last_offset (a call that has no records to
        return raises it at once). Until the caller seeks, the partition is fetched again and
        raises again."""
        return as_table(await self.poll_batches(timeout_ms, max_records))

    async def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Like poll_arrow, as ConsumerRecords (built from the batches' columns, no table)."""
        return fetched_to_records(await self.poll_batches(timeout_ms, max_records))

    async def poll_batches(self, timeout_ms: int, max_records: int | None = None) -> list[tuple[TopicPartition, FetchedBatch]]:
        """What a poll returns (the batches poll and poll_arrow build from), after waiting up to
        `timeout_ms` for records when none are buffered. In a group, the poll first does the
        group's work (`ConsumerCoordinator.poll_steps`), again after each wake-up the group asks
        for. The one poll loop of both consumers: the sync Consumer runs it on its application
        thread (`poll_from`), where the wait blocks on the fetcher's condition, so a record costs
        no hop through the event loop to be returned; a steady-state poll touches only flags."""
        if self._closed:
            raise ConsumerStoppedError("consumer is closed")
        if max_records is None:
            max_records = self.max_poll_records
        fetcher, group = self._fetcher, self._coordinator
        deadline = time.monotonic() + timeout_ms / 1000
        if group is not None:
            group.note_poll_start()
        try:
            while True:
                if group is not None:
                    await run_steps(group.poll_steps(deadline), self._poller)
                batches = fetcher.take_ready(max_records)
                remaining = deadline - time.monotonic()
                if batches or remaining <= 0 or max_records == 0 or fetcher.closed:
                    return batches
                await self._poller.wait(fetcher.wait_for_data, fetcher.wait_for_data_async, remaining)
        finally:
            if group is not None:
                group.note_poll_end()

    def metrics(self) -> dict[str, Any]:
        """This consumer's metrics, with Kafka's names (client/client_metrics.py):
        records-consumed-total / -rate, bytes-consumed-total / -rate, fetch-total,
        fetch-latency-avg / -max (ms, long polls included), records-lag-max, and records-lag: per
        assigned partition, the last fetched high watermark less the position."""
        fetcher, subs = self._fetcher, self._subs
        lags = {tp: max(0, fetcher.high_watermarks[tp] - position) for tp, position in subs.all_consumed().items()
                if tp in fetcher.high_watermarks}
        return fetcher.metrics.snapshot(lags)


    # -- closing ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Leave the group as `unsubscribe` does (commit if auto-commit, on_revoke, LeaveGroup
        unless static), then stop fetching and release everything; calling it again does nothing."""
        if self._closed:
            return
        try:
            await run_steps(self._leave_steps("the consumer is closing"), self._poller)
        finally:
            await self._poller.run(self._shutdown())

    async def _shutdown(self) -> None:
        self._closed = True
        await self._fetcher.close()
        if self._coordinator is not None:
            await self._coordinator.close()
        await self.cluster.close()

    # -- group membership (the work itself is the ConsumerCoordinator's) --------------------------

    def _group(self) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise ValueError("this needs a consumer group: create the consumer with group_id")
        return self._coordinator

    async def subscribe(self, topics: list[str] | None = None, pattern: str | None = None,
                        on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                        on_lost: RebalanceCallback | None = None) -> None:
        """Let the group assign partitions of `topics` (or of every topic whose whole name
        matches the regular expression `pattern`, checked every metadata_max_age_ms). Nothing
        happens until the next poll, which joins. Calling it again replaces the subscription and
        the callbacks (a changed subscription rejoins). See the module docstring for the
        callbacks. Raises ValueError without a group_id, for a bad pattern, or after assign()."""
        group = self._group()
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to either a list of topics or a pattern")
        if isinstance(topics, str):
            raise ValueError(f"topics must be a list of topic names, got the string {topics!r}")
        try:
            compiled = re.compile(pattern) if pattern is not None else None
        except re.error as err:
            raise ValueError(f"bad subscription pattern {pattern!r}: {err}") from err
        group.subscribe(None if topics is None else list(topics), compiled,
                        RebalanceListener(on_assign, on_revoke, on_lost))

    async def unsubscribe(self) -> None:
        """Give up the subscription (commit if auto-commit, on_revoke, LeaveGroup unless static)
        or the manual assignment."""
        await run_steps(self._leave_steps("the consumer unsubscribed"), self._poller)

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None, metadata: str | None = None) -> None:
        """Commit `offsets` (each the next record to consume; default: the current positions of
        every assigned partition) and wait. Raises PartitionNotAssignedError for a partition the
        group did not give this member, RebalanceInProgressError during a rebalance (poll
        finishes it), IllegalGenerationError / UnknownMemberIdError when the membership was
        lost (the next poll rejoins)."""
        await self._group().commit(self.offsets_to_commit(offsets), metadata)

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: CommitCallback | None = None, metadata: str | None = None) -> None:
        """Commit without waiting (call on the consumer's loop); `callback(offsets, error)` runs
        inside a later poll (or close). Never retried."""
        self._group().commit_in_background(self.offsets_to_commit(offsets), metadata, callback)

    def offsets_to_commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """What a commit of `offsets` commits (any thread): the offsets given, checked, else the
        position of every assigned partition now. Raises ValueError without a group_id."""
        self._group()
        return self._subs.all_consumed() if offsets is None else _checked_offsets(offsets)

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        return await self._group().fetch_committed([(t, int(p)) for t, p in partitions])

    def group_metadata(self) -> GroupMetadata:
        """(group_id, generation_id, member_id, group_instance_id) now."""
        return self._group().metadata()

    def _leave_steps(self, reason: str) -> Steps[None]:
        """Unsubscribe or close: the group's part (`ConsumerCoordinator.leave_steps`), then
        forget the remaining assignment, manual or not. A callback's exception is raised last."""
        errors: list[Exception] = []
        if self._coordinator is not None:
            errors = yield from self._coordinator.leave_steps(reason)
        yield self._unassign_all()
        if errors:
            raise errors[0]

    async def _unassign_all(self) -> None:
        with self._subs.lock:
            self._fetcher.assignment_changed(self._subs.unsubscribe())


def as_table(taken: list[tuple[TopicPartition, FetchedBatch]]) -> pa.Table:
    """A poll's batches as one table of RECORD_SCHEMA."""
    return pa.Table.from_batches([to_record_batch(tp[0], tp[1], f) for tp, f in taken], schema=RECORD_SCHEMA)


def _checked_offsets(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Offsets to commit as given by the application: non-negative ints (the next record to consume)."""
    checked = {}
    for (topic, partition), offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset to commit for {topic}-{partition} must be an int >= 0, got {offset!r}")
        checked[(topic, int(partition))] = offset
    return checked


class Consumer:
    """Synchronous consumer over a private background loop.

        consumer = Consumer("127.0.0.1:9092", auto_offset_reset="earliest")
        consumer.assign([("orders", 0), ("orders", 1)])
        table = consumer.poll_arrow(timeout_ms=500)   # pyarrow.Table, RECORD_SCHEMA
        for record in consumer:                       # ConsumerRecord, as they arrive
            ...

    Settings may also be Kafka's dotted names or one dict (`client.config`):
    `Consumer({"bootstrap.servers": "127.0.0.1:9092", "auto.offset.reset": "earliest"})`.

    In a group (see the module docstring for callbacks, commits and delivery semantics):

        consumer = Consumer("127.0.0.1:9092", group_id="billing", auto_offset_reset="earliest")
        consumer.subscribe(["orders"], on_assign=print, on_revoke=print)
        for record in consumer:                       # joins at the first poll; auto-commits
            ...
        consumer.close()                              # commits, leaves the group
    """

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncConsumer.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread(kwargs.get("client_id", "pymq-consumer"))
        try:
            self._core: AsyncConsumer = self._thread.run(AsyncConsumer(bootstrap, **kwargs).start())
        except BaseException:
            self._thread.stop()
            raise
        self._core.poll_from(OnThread(self._thread))

    def _run(self, coro: Any) -> Any:
        return self._thread.run(coro)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """See AsyncConsumer.assign (mutually exclusive with subscribe)."""
        self._run(self._core.assign(list(partitions)))

    def metrics(self) -> dict[str, Any]:
        """See AsyncConsumer.metrics (read without waiting for the I/O thread)."""
        return self._core.metrics()

    def assignment(self) -> list[TopicPartition]:
        return self._core.assignment()

    def subscribe(self, topics: list[str] | None = None, pattern: str | None = None,
                  on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        """See AsyncConsumer.subscribe. The callbacks run on this (the polling) thread."""
        self._run(self._core.subscribe(topics, pattern, on_assign, on_revoke, on_lost))

    def unsubscribe(self) -> None:
        """See AsyncConsumer.unsubscribe; on_revoke runs on this thread."""
        run_blocking(self._core.unsubscribe())

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None, metadata: str | None = None) -> None:
        """See AsyncConsumer.commit: waits for the coordinator's answer."""
        self._run(self._core.commit(offsets, metadata))

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: CommitCallback | None = None, metadata: str | None = None) -> None:
        """Commit without waiting (default: the positions now); `callback(offsets, error)` runs
        on this thread inside a later poll (or close)."""
        core = self._core
        self._thread.call_soon(core.commit_async, core.offsets_to_commit(offsets), callback, metadata)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._run(self._core.committed(list(partitions)))

    def group_metadata(self) -> GroupMetadata:
        return self._core.group_metadata()

    def pause(self, *tps: TopicPartition) -> None:
        self._run(self._core.pause(*tps))

    def resume(self, *tps: TopicPartition) -> None:
        self._run(self._core.resume(*tps))

    def paused(self) -> list[TopicPartition]:
        return self._core.paused()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._run(self._core.seek(tp, offset))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_end(*tps))

    def position(self, tp: TopicPartition) -> int:
        """See AsyncConsumer.position; a partition just assigned by the group whose committed
        offset is not known yet (inside on_assign) has it looked up first, as Kafka does."""
        return run_blocking(self._core.lookup_position(tp))

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        return self._run(self._core.offsets_for_times(timestamps))

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.beginning_offsets(list(tps)))

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.end_offsets(list(tps)))

    def poll_arrow(self, timeout_ms: int = 1000, max_records: int | None = None) -> pa.Table:
        """See AsyncConsumer.poll_arrow. Runs on the calling thread: it waits for the background
        fetcher's data directly, so a record costs no hop through the event loop to be returned."""
        return as_table(run_blocking(self._core.poll_batches(timeout_ms, max_records)))

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """See AsyncConsumer.poll; on the calling thread, like poll_arrow."""
        return fetched_to_records(run_blocking(self._core.poll_batches(timeout_ms, max_records)))

    def records(self, idle_timeout_ms: int | None = None) -> Iterator[ConsumerRecord]:
        """Every record of the assigned partitions as it arrives, for `for record in ...` loops.
        Runs until the consumer is closed, or until no record arrived for `idle_timeout_ms` (None:
        forever, as `for record in consumer` does). Errors (e.g. CorruptRecordError) are raised
        from the loop after every record before them was yielded; seek past and iterate again.

        A record counts as consumed once it was yielded. A loop that stops early (`break`, an
        exception) leaves the rest of the polled batch unconsumed: the positions move back to the
        first record not yielded, so the next poll returns it and no commit covers it."""
        idle_since = time.monotonic()
        while not self._core.closed:
            batch = self.poll(timeout_ms=200 if idle_timeout_ms is None else min(200, idle_timeout_ms))
            if batch:
                yielded = 0
                try:
                    for consumed in batch:
                        yield consumed
                        yielded += 1
                finally:
                    if yielded < len(batch) - 1:  # the record being yielded is consumed
                        self._rewind(batch[yielded + 1:])
                idle_since = time.monotonic()
            elif idle_timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms:
                return

    def _rewind(self, unconsumed: list[ConsumerRecord]) -> None:
        """Move each partition's position back to its first record in `unconsumed`."""
        if self._core.closed:
            return
        first: dict[TopicPartition, int] = {}
        for item in unconsumed:
            first.setdefault((item.topic, item.partition), item.offset)
        self._run(self._core.rewind(first))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self.records()

    def close(self) -> None:
        """See AsyncConsumer.close (on_revoke runs on this thread); calling it again does nothing."""
        if self._core.closed:
            return
        try:
            run_blocking(self._core.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
