"""Fetcher: fetch requests, the fetched-records buffer, and decoding fetched batches (Kafka's Fetcher
and FetchBuffer).

A fetch loop per leader keeps one long-polling Fetch in flight for every assigned, unpaused
partition with a fetch position while the buffer holds less than `max_buffer_bytes`, so the next
poll usually finds data already decoded. The next fetch goes out before a reply's records are
decoded (its positions come from the batch headers), so a tailing consumer always has a long poll
parked at the broker. Replies are decoded by `decoder.decode_fetched` (CRC when `check_crcs`,
zero-copy Arrow bodies, rows before the position dropped) into the buffer (`FetchBuffer`: a
queue per partition, polls take from the partitions in turn). A partition a poll took records from
goes to the back of the fetch order (Kafka's `movePartitionToEnd`): the next fetch names the others
first, so a broker filling a reply up to `fetch_max_bytes` does not favour one partition.

A batch that fails its checks, or a broker's non-retriable error for a partition, becomes a
marker in the buffer after the partition's records fetched before it: the poll that reaches it
raises it, and the partition fetches nothing more until then (or until a seek). An out-of-range
fetch position is reset per the subscription's `auto_offset_reset`. A fetch that a leader let time
out (hung) is not sent to it again until it answers a probe or metadata moves its partitions
(Cluster.await_answer_or_move).

A topic deleted and re-created under the consumer (KIP-516): every Fetch names the topic id its
positions belong to (`topic_ids`), so the broker answers INCONSISTENT_TOPIC_ID rather than the
new topic's records at the old offsets; while an assigned partition has no leader (its topic is
gone) metadata is refreshed with backoff until it has one, and a warning names the topic once
when it goes and once when it is back (`_note_gone_topics`). Metadata naming another id resets the
topic's positions per `auto_offset_reset`, or with "none" raises InconsistentTopicIdError at the
poll that reaches it, after which the partition has no position until a seek (Kafka's consumer).

Thread rules: the fetch loops run on the consumer's loop. `take_ready` and `wait_for_data` may
be called from the sync Consumer's application thread: the buffer is guarded by the
subscription state's `lock` (one lock for records and positions), `_arrived` wakes such a
poller, and async pollers wait on `data_ready`. Everything else is loop-local.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from client.client_metrics import ConsumerMetrics
from client.config import RETRY_BACKOFF_MAX_S
from client.cluster import Cluster
from client.connection import BrokerConnection, Reply, decode_reply
from client.decoder import AbortedFilter, FetchedBatch, decode_fetched
from client.fetch_buffer import Entry, FetchBuffer
from client.offset_fetcher import reset_offsets
from client.retry import Retry, retriable
from client.subscription_state import SubscriptionState
from common.errors import (
    CorruptMessageError,
    CorruptRecordError,
    InconsistentTopicIdError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    PymqError,
)
from common.topic_partition import TopicPartition
from protocol import READ_UNCOMMITTED, AbortedTransaction, FetchPartition, FetchRequest, FetchResponse, TopicRequest
from segment_format import record

log = logging.getLogger("pymq.consumer")

METADATA_BACKOFF_MAX_S = RETRY_BACKOFF_MAX_S  # the longest wait between metadata refreshes for a leader


class Fetcher:
    """Fetches the subscription's partitions into a buffer that polls take from (see the module
    docstring). `start` binds it to the consumer's loop; `close` stops its fetch loops."""

    def __init__(self, cluster: Cluster, subscriptions: SubscriptionState, *, fetch_max_wait_ms: int,
                 fetch_min_bytes: int, fetch_max_bytes: int, max_partition_fetch_bytes: int, max_buffer_bytes: int,
                 check_crcs: bool, request_timeout_s: float, retry_backoff_s: float,
                 isolation_level: int = READ_UNCOMMITTED) -> None:
        self.cluster = cluster
        self.isolation_level = isolation_level  # read_committed: up to the LSO, aborted transactions dropped
        self._subs = subscriptions
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.check_crcs = check_crcs
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.high_watermarks: dict[TopicPartition, int] = {}
        self.metrics = ConsumerMetrics()  # the consumer's own (Consumer.metrics())
        # Per partition: its batches, then possibly an error marker where its fetched data turned
        # out corrupt or its broker answered a non-retriable error: records before it are
        # delivered first, and the partition fetches nothing more until that error was raised.
        self._buffer = FetchBuffer()
        self._arrived = threading.Condition(subscriptions.lock)
        self.data_ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._waiting_for_room = False  # a fetch loop waits for poll to make room in the buffer
        self._error: Exception | None = None
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._epoch = 0  # bumped on every assign/seek: fetched data from an older epoch is dropped
        # Bumped whenever the partitions to fetch change without an epoch (group assignment, pause,
        # resume, new start positions): a fetch sent ahead keeps its partitions, so one planned
        # before the change is not sent and the loop plans again.
        self._plan = 0
        # Set (under the lock) when the group needs the poller's attention: it stops waiting for records.
        self.attention = False
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # The incarnation (topic id) of each fetched topic that its positions belong to, taken
        # from metadata when the topic is first fetched; metadata naming another one means the
        # topic was deleted and re-created (`_follow_recreated`).
        self.topic_ids: dict[str, str] = {}
        self._leaderless: asyncio.Task[None] | None = None  # refreshes metadata while a partition has no leader
        self._gone_topics: set[str] = set()  # assigned topics the last metadata did not know (logged once)
        # Called (on the loop) after each metadata refresh: the group's coordinator compares the
        # partition counts it assigned from (a subscribed topic deleted or re-created).
        self.metadata_listener: Callable[[], None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def close(self) -> None:
        """Stop the fetch loops and wake a waiting poller (it sees the consumer closed)."""
        self.closed = True
        self._changed.set()
        with self._subs.lock:
            self._arrived.notify_all()
        tasks = [*self._fetchers.values(), *([self._leaderless] if self._leaderless is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_for_data_async(self, timeout_s: float) -> None:
        """Wait on the loop until records or an error are buffered (or the group needs the
        poller, or the consumer closes), up to `timeout_s`."""
        if self.attention or self.closed:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.data_ready.wait()
        except TimeoutError:
            pass

    def replan(self) -> None:
        """The partitions to fetch changed (loop): fetch loops plan their next fetch afresh."""
        self._plan += 1
        self._changed.set()

    def assignment_changed(self, removed: set[TopicPartition]) -> None:
        """The subscription's assignment changed and `removed` went (loop; the caller holds the
        subscription's `lock` around the change and this call): their buffered records go in
        the same step, so no poll returns a record of a partition it no longer has."""
        self.drop_buffered(removed)
        kept = {topic for topic, _ in self._subs.assigned_partitions()}
        self.topic_ids = {topic: topic_id for topic, topic_id in self.topic_ids.items() if topic in kept}
        self.replan()

    def drop_buffered(self, tps: set[TopicPartition]) -> None:
        """Forget the buffered records (and error markers) of `tps` (`_lock` held)."""
        self._buffer.drop(tps)
        if not self._buffer:
            self.data_ready.clear()

    def invalidate(self) -> None:
        """Positions changed: drop prefetched data, and restart fetching from the consumed
        positions at once (a parked long poll for the old positions is abandoned)."""
        self._epoch += 1
        with self._subs.lock:
            self._buffer.clear()
            self.data_ready.clear()
            self._subs.rewind_fetch_positions()
        for task in self._fetchers.values():
            task.cancel()
        self._fetchers = {}
        self.ensure_fetchers()

    def take_ready(self, max_records: int | None) -> list[tuple[TopicPartition, FetchedBatch]]:
        """What a poll returns now (any thread): a pending error is raised, else the buffered
        records up to `max_records`. Fetchers waiting for room in the buffer are woken."""
        wake = False
        try:
            with self._subs.lock:
                try:
                    if self._error is not None:
                        err, self._error = self._error, None
                        raise err
                    missing = self._subs.missing_positions()
                    if missing:
                        raise NoOffsetForPartitionError(f"no position for {missing}: seek first (auto_offset_reset=none)")
                    batches = self._take(max_records if max_records is not None else float("inf"))
                    if not batches and self._buffer:
                        raise self._partition_error_reached()
                finally:
                    if not self._buffer:
                        self.data_ready.clear()
                    wake, self._waiting_for_room = self._waiting_for_room, False
        finally:
            if wake:
                self._wake_fetchers()
        return batches

    def _wake_fetchers(self) -> None:
        """Set `_changed` on the loop, from whichever thread polled."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._changed.set()
        else:
            loop.call_soon_threadsafe(self._changed.set)

    def wait_for_data(self, timeout_s: float) -> None:
        """Block the calling (non-loop) thread until records or an error are buffered, the
        consumer closes, the group needs the poller, or `timeout_s` passes: the sync Consumer's
        poll, without a loop hop."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while not self._buffer and self._error is None and not self.closed and not self.attention:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._arrived.wait(remaining)

    def _signal(self) -> None:
        """Records or an error arrived (loop thread, `_lock` held): wake pollers of both kinds."""
        self.data_ready.set()
        self._arrived.notify_all()

    def _take(self, limit: float) -> list[tuple[TopicPartition, FetchedBatch]]:
        """Up to `limit` buffered rows, taken from the partitions in turn (`FetchBuffer.take`);
        the partitions taken from go to the back of the fetch order. An error marker stays
        buffered; a corrupt batch's, once the rows before it are taken, sets its partition's
        position."""
        batches: list[tuple[TopicPartition, FetchedBatch]] = []
        for tp, batch, size in self._buffer.take(limit):
            batches.append((tp, batch))
            self.metrics.consumed(batch.num_rows, size)
            self._subs.update_position(tp, batch.next_offset)
        self._subs.move_to_end(dict.fromkeys(tp for tp, _ in batches))
        for tp, err in self._buffer.blocked():
            if isinstance(err, CorruptRecordError):  # nothing of tp follows it: its fetching stopped there
                self._subs.update_position(tp, err.offset)
        return batches

    def _partition_error_reached(self) -> PymqError:
        """Take the first error marker a partition's records reached (`_lock` held; nothing else is
        buffered); the partition is fetched again from its position, so the error comes back
        until the caller seeks past it (or it clears)."""
        tp, _ = self._buffer.blocked()[0]
        err = self._buffer.pop_error(tp)
        if isinstance(err, InconsistentTopicIdError):
            self._subs.clear_position(tp)  # an offset of the deleted topic means nothing in the new one: seek
        else:
            self._subs.set_fetch_position(tp, self._subs.position(tp))
        # The partition's fetcher has it back: wake it, and let it plan afresh (a fetch sent
        # ahead for the leader's other partitions would otherwise keep leaving it out).
        self._plan += 1
        self._waiting_for_room = True
        return err

    def ensure_fetchers(self) -> None:
        loop = asyncio.get_running_loop()
        for node in {p.leader for t, ps in self.cluster.topics.items() for p in ps if self._subs.is_assigned((t, p.partition))}:
            task = self._fetchers.get(node)
            if task is None or task.done():
                self._fetchers[node] = loop.create_task(self._fetch_loop(node))
        if (self._leaderless is None or self._leaderless.done()) and self._any_leaderless():
            self._leaderless = loop.create_task(self._await_leaders())

    def _any_leaderless(self) -> bool:
        return any(self._leader(tp) is None for tp in self._subs.assigned_partitions())

    async def _await_leaders(self) -> None:
        """Refresh metadata until every assigned partition has a leader again, waiting
        retry_backoff_s, doubling up to METADATA_BACKOFF_MAX_S. No fetch loop asks for a partition
        whose topic is gone (deleted): without this it would never be fetched again, not even
        once the topic is re-created."""
        retry = Retry(self.retry_backoff_s)
        while not self.closed and self._any_leaderless():
            await asyncio.sleep(retry.next_delay_s())
            await self._refresh_quietly()

    async def _fetch_loop(self, node: int) -> None:
        me = asyncio.current_task()
        ahead: _Fetch | None = None  # the next fetch, sent before the last reply was decoded
        retry = Retry(self.retry_backoff_s)  # the client.retry policy: back-off, refresh, again
        try:
            # A loop replaced by _invalidate ends even if its cancellation was lost (asyncio.wait_for
            # can swallow one whose inner future completed at the same moment): two loops fetching
            # one partition would deliver its records twice.
            while not self.closed and self._fetchers.get(node) is me:
                fetch, ahead = ahead, None
                mine: list[TopicPartition] = []
                if fetch is None:
                    self._changed.clear()
                    mine = self._subs.in_fetch_order(
                        tp for tp in self._subs.fetchable_partitions() if self._leader(tp) == node)
                    with self._subs.lock:  # checked and flagged at once: a poll in between would not wake us
                        idle = not mine or self._buffer.bytes >= self.max_buffer_bytes
                        if idle:
                            self._waiting_for_room = True
                    if idle:
                        await self._changed.wait()
                        continue
                try:
                    if fetch is None:
                        conn = await self.cluster.connection(node)
                        fetch = self._send_fetch(conn, {tp: self._subs.fetch_position(tp) for tp in mine})
                    ahead = await self._complete_fetch(node, fetch)
                    retry.reset()
                except PymqError as err:
                    if retriable(err):
                        # The leader gone, hung, or not registered (yet, or any more: a failover
                        # in progress): new metadata moves the partition or the loop tries again.
                        log.info("fetch from broker %d failed: %s; retrying", node, err)
                        if fetch is not None and fetch.conn.unanswered(err):
                            # Hung: a fetch sent again before its partitions move (a session
                            # timeout away) would wait out another request timeout.
                            await self.cluster.await_answer_or_move(
                                node, self._refresh_quietly, lambda: not self._leads_any(node),
                                max(self.retry_backoff_s, 0.1))
                            continue
                        await retry.back_off(err)
                        await self._refresh_quietly()
                        continue
                    self._report(err)
                    await self._changed.wait()
                except Exception as err:  # a defect, not the broker: poll raises it, the loop is not left dead unseen
                    log.exception("fetching from broker %d failed", node)
                    self._report(err)
                    await self._changed.wait()
        finally:
            if ahead is not None:
                ahead.reply.cancel()

    def _report(self, err: Exception) -> None:
        """The next poll raises `err`; the loop waits for a change (a seek, another poll) to fetch again."""
        with self._subs.lock:
            self._error = err
            self._waiting_for_room = True
            self._signal()

    def _leads_any(self, node: int) -> bool:
        return any(self._leader(tp) == node for tp in self._subs.assigned_partitions())

    def _leader(self, tp: TopicPartition) -> int | None:
        parts = self.cluster.topics.get(tp[0])
        return parts[tp[1]].leader if parts and tp[1] < len(parts) else None

    async def _refresh_quietly(self) -> None:
        """Reload metadata after a retriable error; a partition whose leader moved is then
        fetched by the loop of its new leader (started here if there is none yet, woken if it
        sat idle)."""
        leaders = self._leaders()
        try:
            await self.cluster.refresh()
        except PymqError as err:
            log.info("metadata refresh failed: %s", err)
            return
        self._note_gone_topics()
        if self.metadata_listener is not None:
            self.metadata_listener()
        for topic, topic_id in list(self.topic_ids.items()):
            current = self.cluster.topic_ids.get(topic)
            if current and current != topic_id:
                await self._follow_recreated(topic, current)
        if self._leaders() != leaders:
            self.ensure_fetchers()
            self.replan()

    def positions_are_current(self, topic: str) -> bool:
        """Whether `topic`'s positions belong to the topic metadata shows (any thread: it only
        reads): false once it is gone, or re-created and its positions not reset yet
        (`_follow_recreated`)."""
        if topic not in self.cluster.topics:
            return False
        fetched, current = self.topic_ids.get(topic), self.cluster.topic_ids.get(topic)
        return fetched is None or current is None or fetched == current

    def _note_gone_topics(self) -> None:
        """Log once when an assigned topic disappears from metadata (deleted: its partitions get
        no records, and metadata is refreshed with backoff until it is back) and once when it is
        back, rather than retrying silently (Kafka's consumer warns UNKNOWN_TOPIC_OR_PARTITION)."""
        assigned = {topic for topic, _ in self._subs.assigned_partitions()}
        gone = {topic for topic in assigned if topic not in self.cluster.topics}
        for topic in sorted(gone - self._gone_topics):
            log.warning("assigned topic %s is gone (UNKNOWN_TOPIC_OR_PARTITION: deleted?): its partitions get no "
                        "records until it is re-created or unassigned; metadata is refreshed every %.1f s at most",
                        topic, max(METADATA_BACKOFF_MAX_S, self.retry_backoff_s))
        for topic in sorted(self._gone_topics & assigned - gone):
            log.warning("assigned topic %s is back in metadata: fetching it again", topic)
        self._gone_topics = gone

    async def _follow_recreated(self, topic: str, topic_id: str) -> None:
        """Metadata names another incarnation of `topic` than its positions belong to: it was
        deleted and re-created, and offsets of the old one mean nothing in the new one. Reset
        its assigned partitions per auto_offset_reset (the records of the old one fetched before
        are still returned first), or with "none" hold InconsistentTopicIdError for the poll
        that reaches it; nothing moves if a seek or assign came meanwhile. A reset whose
        ListOffsets fails (the new topic's leaders not elected yet) is tried again at the next
        metadata refresh: the old id is kept until it succeeds."""
        old = self.topic_ids[topic]
        tps = [tp for tp in self._subs.assigned_partitions() if tp[0] == topic]
        strategy = self._subs.auto_offset_reset
        log.warning("topic %s was deleted and re-created (topic id %s, was %s): %s", topic, topic_id, old,
                    "resetting its positions to " + strategy if strategy != "none" else "no reset (auto_offset_reset=none)")
        if strategy == "none":
            self.topic_ids[topic] = topic_id
            for tp in tps:
                self._hold_error(tp, InconsistentTopicIdError(
                    f"{tp[0]}-{tp[1]}: the topic was deleted and re-created (topic id {topic_id}, was {old}): its "
                    f"position means nothing in the new topic; seek to choose one (auto_offset_reset=none)"))
            self.replan()
            return
        epoch = self._epoch
        try:
            found = await reset_offsets(self.cluster, tps, strategy, self.isolation_level)
        except PymqError as err:
            log.info("resetting the positions of re-created topic %s failed: %s; retrying", topic, err)
            return
        self.topic_ids[topic] = topic_id
        if epoch != self._epoch:
            return
        with self._subs.lock:
            buffered = self._buffer.partitions()
            for tp, offset in found.items():
                if self._subs.is_assigned(tp):
                    self._subs.reset_fetch_position(tp, offset, with_position=tp not in buffered)
        self.replan()

    def _leaders(self) -> dict[TopicPartition, int | None]:
        return {tp: self._leader(tp) for tp in self._subs.assigned_partitions()}

    def _send_fetch(self, conn: BrokerConnection, positions: dict[TopicPartition, int]) -> "_Fetch":
        """Write a Fetch for `positions` now (no await between deciding and writing)."""
        by_topic: dict[str, list[FetchPartition]] = {}
        for (topic, partition), offset in positions.items():
            by_topic.setdefault(topic, []).append(FetchPartition(partition, offset, self.max_partition_fetch_bytes))
            if topic not in self.topic_ids and self.cluster.topic_ids.get(topic):
                self.topic_ids[topic] = self.cluster.topic_ids[topic]
        request = FetchRequest(tuple(TopicRequest(t, tuple(ps), self.topic_ids.get(t)) for t, ps in by_topic.items()),
                               self.fetch_max_wait_ms, self.fetch_min_bytes, self.fetch_max_bytes,
                               isolation_level=self.isolation_level)
        reply = conn.request(request, self.request_timeout_s + self.fetch_max_wait_ms / 1000)
        return _Fetch(request, conn, reply, positions, self._epoch, self._plan, time.monotonic())

    async def _complete_fetch(self, node: int, fetch: "_Fetch") -> "_Fetch | None":
        """Buffer one fetch's records; the next fetch if it could be sent ahead of decoding them.

        A partition's data is taken only if the fetch asked for the partition's current fetch
        position: data of an older epoch (a seek or assign since), or following a batch found
        corrupt, starts at a stale offset and is dropped."""
        control, payload = await fetch.reply
        self.metrics.fetched(time.monotonic() - fetch.sent)
        reply = decode_reply(fetch.request, control, payload)
        if fetch.epoch != self._epoch:
            return None
        ahead = self._fetch_ahead(node, fetch, reply)
        try:
            reset: list[TopicPartition] = []
            for t in reply.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition)
                    err = p.error()
                    if err is not None:
                        if isinstance(err, OffsetOutOfRangeError) and self._subs.auto_offset_reset != "none":
                            reset.append(tp)
                            continue
                        if retriable(err) or isinstance(err, InconsistentTopicIdError):
                            # INCONSISTENT_TOPIC_ID: re-created; metadata has the new id (_follow_recreated)
                            await self._refresh_quietly()
                            continue
                        if self._subs.fetch_position(tp) == fetch.requested.get(tp):
                            self._hold_error(tp, err)
                        continue
                    self.high_watermarks[tp] = p.high_watermark
                    if self._subs.fetch_position(tp) == fetch.requested.get(tp) and self._subs.is_fetchable(tp):
                        self._absorb(tp, p.records, p.aborted_transactions)  # type: ignore[arg-type]
            if reset:
                await self._reset_fetch_positions({tp: fetch.requested[tp] for tp in reset}, fetch.epoch)
        except BaseException:
            if ahead is not None:
                ahead.reply.cancel()
            raise
        if ahead is not None and any(self._subs.fetch_position(tp) != at for tp, at in ahead.requested.items()):
            ahead.reply.cancel()  # decoding stopped short of where the headers said (a corrupt batch)
            return None
        return ahead

    def _fetch_ahead(self, node: int, fetch: "_Fetch", reply: FetchResponse) -> "_Fetch | None":
        """Send the next fetch before this reply's records are decoded, from the positions its
        complete batches move each partition to (read from the batch headers alone).

        The broker then holds the next long poll while this reply is decoded, and the I/O thread
        has nothing left to do once it hands the records to the sync Consumer's poll(): that
        thread waits for the GIL, which it gets only when this one goes idle. Only the plain
        case goes ahead: every partition answered without error and the buffer has room for
        what this reply brings; anything else waits for the reply to be handled first."""
        conn = self.cluster.open_connection(node)
        if conn is None or fetch.plan != self._plan or any(self._subs.fetch_position(tp) != at
                                                           for tp, at in fetch.requested.items()):
            return None
        positions = {tp: fetch.requested[tp] for tp in self._subs.in_fetch_order(fetch.requested)}
        incoming = 0
        try:
            for t in reply.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition)
                    if p.error_code or tp not in positions:
                        return None
                    for _, header in record.iter_batches(p.records, verify=False):
                        positions[tp] = max(positions[tp], header.next_offset)
                    incoming += len(p.records)
        except CorruptMessageError:
            return None  # _absorb finds and reports it
        if self._buffer.bytes + incoming >= self.max_buffer_bytes:
            return None
        return self._send_fetch(conn, positions)

    async def _reset_fetch_positions(self, out_of_range: dict[TopicPartition, int], epoch: int) -> None:
        """Out of range (e.g. retention passed us): jump per auto_offset_reset. The consumed
        position follows unless records before the jump are still buffered for poll. Nothing
        moves if the position changed meanwhile (a seek, or another answer already applied)."""
        log.warning("offsets out of range for %s; resetting to %s", list(out_of_range), self._subs.auto_offset_reset)
        found = await reset_offsets(self.cluster, out_of_range, self._subs.auto_offset_reset, self.isolation_level)
        if epoch != self._epoch:
            return
        with self._subs.lock:
            buffered = self._buffer.partitions()
            for tp, offset in found.items():
                if self._subs.fetch_position(tp) == out_of_range[tp]:
                    self._subs.reset_fetch_position(tp, offset, with_position=tp not in buffered)

    def _hold_error(self, tp: TopicPartition, err: PymqError) -> None:
        """A broker's non-retriable error for `tp`: a marker after its buffered records, raised
        by the poll that reaches it; the partition fetches nothing more until then."""
        log.warning("fetch of %s-%d failed: %s", tp[0], tp[1], err)
        with self._subs.lock:
            self._buffer.extend(tp, [(err, 0)])
            self._subs.stop_fetching(tp)
            self._signal()

    def _absorb(self, tp: TopicPartition, data: memoryview, aborted: tuple[AbortedTransaction, ...] | None) -> None:
        """Decode the complete batches of one partition's fetched bytes into the buffer. At a
        corrupt batch, what came before it stays buffered, a marker for it follows, and the
        partition fetches nothing more until the marker was raised (or the caller seeks).
        Decoding happens outside `_lock`; the buffer is extended under it in one step."""
        skip = None if self.isolation_level == READ_UNCOMMITTED else AbortedFilter(
            (a.producer_id, a.first_offset) for a in aborted or ())
        decoded = decode_fetched(tp, data, self._subs.fetch_position(tp), self.high_watermarks.get(tp, -1),
                                 self.check_crcs, skip)
        fresh: list[Entry] = list(decoded.batches)
        corrupt, position = decoded.corrupt, decoded.position
        if corrupt is not None:
            log.warning("corrupt batch: %s", corrupt)
            fresh.append((corrupt, 0))
        if not fresh:
            return
        with self._subs.lock:
            self._buffer.extend(tp, fresh)
            if corrupt is not None:
                self._subs.stop_fetching(tp)
            else:
                self._subs.set_fetch_position(tp, position)
            self._signal()

    def clear_attention(self) -> None:
        """The poller is attending to the group (any thread): it waits for records again."""
        with self._subs.lock:
            self.attention = False

    def wake_poller(self) -> None:
        """The group needs the poller (loop): stop waiting for records."""
        with self._subs.lock:
            self.attention = True
            self.data_ready.set()
            self._arrived.notify_all()


class _Fetch(NamedTuple):
    """A Fetch in flight: the request, its connection and raw reply, the positions it asked for,
    and the epoch (of assign/seek) it was sent in."""

    request: FetchRequest
    conn: BrokerConnection  # the connection it went on
    reply: asyncio.Future[Reply]
    requested: dict[TopicPartition, int]
    epoch: int
    plan: int  # the fetcher's `_plan` when it was sent
    sent: float  # time.monotonic() when it was written (fetch latency)
