"""Replica fetchers: a follower copies its leaders' logs (Kafka's ReplicaFetcherThread).

One `ReplicaFetcher` per leader broker fetches every partition this broker follows from it, in
one Fetch request at a time (`replica_id` = this broker, so the leader reads to its log end and
learns how far the follower got), on a connection that first identifies itself as this registered
broker (BrokerHandshake, broker/cluster/broker_identity.py). A partition starts in the
truncating state: its log may hold a tail the new leader does not have (written under an older
epoch by a leader that died before the tail was replicated), so the fetcher first asks the leader
where the follower's latest epoch ends (OffsetForLeaderEpoch, KIP-101 with KIP-279's rule for
epochs the leader never had) and cuts the log there. Only then does it fetch, appending the leader's batches with their offsets and epochs
(`append_as_follower`, on a worker thread) and taking the leader's high watermark as far as its
own log reaches.

Every append and truncation of a partition holds that partition's lock, and checks under it that
the partition is still fetched in the same state: a partition whose leader changed moves to
another fetcher, and the old one's append in flight must finish (or not start) before the new one
truncates. Leadership taken by this broker waits for the lock too (`unfollow`).

Truncation also writes the offset checkpoints (the lowered recovery point): a crash after it
must re-validate what is appended at those offsets next.

A follower behind its leader's log start (retention ran while it was away) restarts its log at
that start. One behind only the leader's local log start, on a tiered partition (the leader
answers OFFSET_OUT_OF_RANGE below its high watermark and at or above its log start: only the
remote tier holds those offsets), does not fetch them through the leader: it reads the remote
manifest and restarts its log where the remote log ends (at or above the leader's local start,
since the leader deletes only what is uploaded), with the log start, the leader epochs and the
uploaded offsets the manifest records (KIP-405's follower; `UnifiedLog.rebuild_from_remote`).

Faults: a leader that cannot be reached, or answers NOT_LEADER / FENCED_LEADER_EPOCH (this
broker's metadata is behind the controller's), is retried after `replica.fetch.backoff.ms`; the
metadata listener moves the partition to its new leader's fetcher.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from broker import background
from broker.cluster.partition import Partition
from broker.executors import BoundedExecutor
from broker.log import UnifiedLog
from client.connection import BrokerConnection
from common.errors import (
    NetworkError,
    OffsetOutOfRangeError,
    PymqError,
    error_for_code,
)
from common.topic_partition import TopicPartition
from protocol import (
    UNDEFINED_EPOCH_OFFSET,
    BrokerHandshakeRequest,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    TopicRequest,
)
from segment_format import record
from segment_format.manifest import PartitionManifest

log = logging.getLogger("pymq.replication")

Address = Callable[[int], "tuple[str, int] | None"]  # broker id -> its host and port, if registered
RemoteManifest = Callable[[UnifiedLog], PartitionManifest]  # blocking: the partition's current remote manifest
# blocking: the producer snapshot the manifest's last segment was uploaded with (None: none)
RemoteProducerSnapshot = Callable[[UnifiedLog, PartitionManifest], "bytes | None"]


@dataclass(frozen=True, slots=True)
class FetchSettings:
    broker_id: int
    wait_max_ms: int = 500
    partition_max_bytes: int = 8 << 20
    response_max_bytes: int = 32 << 20
    backoff_ms: int = 200
    request_timeout_ms: int = 30_000
    local_host: str | None = None  # the address fetches leave from (the broker's own)
    throttle_bytes_per_s: int | None = None  # replica.throttle.bytes.per.second for out-of-sync partitions
    incarnation: str = ""  # this broker's, from its registration: the handshake's proof (broker_identity.py)


class Throttle:
    """A token bucket of bytes per second shared by the partitions this broker follows while out
    of sync (catching up after a restart, or moved here by a reassignment), so that catching up
    does not starve in-sync replication or clients (Kafka's replication quota). A burst of one
    second's worth is allowed; past it, throttled partitions sit out fetches until it refills."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float]) -> None:
        self.rate = float(bytes_per_s)
        self.clock = clock
        self.allowance = self.rate
        self.updated = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.allowance = min(self.rate, self.allowance + (now - self.updated) * self.rate)
        self.updated = now

    def available(self) -> bool:
        self._refill()
        return self.allowance > 0

    def consume(self, size: int) -> None:
        self._refill()
        self.allowance -= size

    def wait_s(self) -> float:
        self._refill()
        return max(0.0, -self.allowance / self.rate)


@dataclass(eq=False, slots=True)
class _Fetching:
    """One partition as its fetcher holds it. A new one replaces it when the partition's leader
    or epoch changes, so identity says whether an answer is still for the current state."""

    partition: Partition
    leader: int
    epoch: int
    truncating: bool = True
    retry_at: float = 0.0

    @property
    def key(self) -> TopicPartition:
        return (self.partition.topic, self.partition.partition)

    @property
    def log(self) -> UnifiedLog:
        return self.partition.log


class ReplicaFetcherManager:
    """The fetchers of one broker, keyed by leader. Loop-local."""

    def __init__(self, settings: FetchSettings, executor: BoundedExecutor, address: Address,
                 flush_if_needed: Callable[[UnifiedLog], None], checkpoint: Callable[[], None],
                 remote_manifest: RemoteManifest | None = None,
                 remote_producer_snapshot: RemoteProducerSnapshot | None = None) -> None:
        self.settings = settings
        self.executor = executor
        self.address = address
        self.flush_if_needed = flush_if_needed
        self.checkpoint = checkpoint  # writes the directory's offset checkpoints (from a worker thread)
        self.remote_manifest = remote_manifest  # None: this broker does not run tiered storage
        self.remote_producer_snapshot = remote_producer_snapshot
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._followed: dict[TopicPartition, _Fetching] = {}
        rate = settings.throttle_bytes_per_s
        self.throttle = None if rate is None else Throttle(rate, lambda: asyncio.get_running_loop().time())

    def follow(self, partition: Partition) -> None:
        """Fetch `partition` from its leader, truncating it first."""
        key = (partition.topic, partition.partition)
        self._drop(key)
        state = _Fetching(partition, partition.state.leader, partition.leader_epoch)
        self._followed[key] = state
        fetcher = self._fetchers.get(state.leader)
        if fetcher is None:
            fetcher = self._fetchers[state.leader] = ReplicaFetcher(self, state.leader)
        fetcher.add(state)

    def unfollow(self, key: TopicPartition) -> asyncio.Future[None]:
        """Stop fetching `key`; the returned future is done once no append or truncation of it runs."""
        self._drop(key)
        return asyncio.ensure_future(self._quiesce(key))

    async def _quiesce(self, key: TopicPartition) -> None:
        async with self.lock(key):
            pass

    def _drop(self, key: TopicPartition) -> None:
        old = self._followed.pop(key, None)
        if old is not None:
            fetcher = self._fetchers.get(old.leader)
            if fetcher is not None:
                fetcher.remove(key)

    def is_current(self, state: _Fetching) -> bool:
        return self._followed.get(state.key) is state

    def lock(self, key: TopicPartition) -> asyncio.Lock:
        found = self._locks.get(key)
        if found is None:
            found = self._locks[key] = asyncio.Lock()
        return found

    def fetcher_stopped(self, leader: int, fetcher: "ReplicaFetcher") -> None:
        if self._fetchers.get(leader) is fetcher:
            del self._fetchers[leader]

    async def close(self) -> None:
        fetchers = list(self._fetchers.values())
        self._fetchers.clear()
        self._followed.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), return_exceptions=True)


class ReplicaFetcher:
    """Fetches the partitions this broker follows from one leader broker, in a task that runs
    while it has partitions."""

    def __init__(self, manager: ReplicaFetcherManager, leader: int) -> None:
        self.manager = manager
        self.settings = manager.settings
        self.leader = leader
        self.partitions: dict[TopicPartition, _Fetching] = {}
        self._connection: BrokerConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()

    def add(self, state: _Fetching) -> None:
        self.partitions[state.key] = state
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"replica-fetcher-{self.leader}")

    def remove(self, key: TopicPartition) -> None:
        self.partitions.pop(key, None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._close_connection()

    async def _run(self) -> None:
        try:
            while self.partitions:
                try:
                    await self._round()
                except (NetworkError, PymqError, OSError) as err:
                    log.info("replica fetcher for broker %d: %s; retrying in %d ms", self.leader, err,
                             self.settings.backoff_ms)
                    self._close_connection()
                    await self._pause(self.settings.backoff_ms / 1000)
        finally:
            self._close_connection()
            self.manager.fetcher_stopped(self.leader, self)

    async def _pause(self, seconds: float) -> None:
        self._wakeup.clear()
        await background.wait_event(self._wakeup, seconds)

    def _throttled(self, state: _Fetching) -> bool:
        """Out of sync while the replication throttle has no bytes left: sits this fetch out."""
        throttle = self.manager.throttle
        return (throttle is not None and self.settings.broker_id not in state.partition.state.isr
                and not throttle.available())

    async def _round(self) -> None:
        # A state its manager no longer follows (replaced, unfollowed, or every one at a stop) is
        # dropped, not skipped: a round of skipped states awaits nothing that yields (the connection
        # is open), and the loop spun on them for ever, the event loop with it (a broker whose stop
        # cleared them while this task's cancellation was lost hung until SIGKILLed).
        for key in [key for key, state in self.partitions.items() if not self.manager.is_current(state)]:
            del self.partitions[key]
        if not self.partitions:
            return
        now = asyncio.get_running_loop().time()
        waiting = [s for s in self.partitions.values() if s.retry_at <= now]
        ready = [s for s in waiting if s.truncating or not self._throttled(s)]
        if not ready:
            throttle = self.manager.throttle
            later = [s.retry_at - now for s in self.partitions.values() if s.retry_at > now]
            if waiting and throttle is not None:
                later.append(throttle.wait_s())
            await self._pause(max(min(later, default=0.0), 0.001))
            return
        connection = await self._connect()
        truncating = [s for s in ready if s.truncating]
        if truncating:
            await self._truncate(connection, truncating)
        fetching = [s for s in ready if not s.truncating and self.manager.is_current(s)]
        if fetching:
            await self._fetch(connection, fetching)

    async def _connect(self) -> BrokerConnection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        address = self.manager.address(self.leader)
        if address is None:
            raise NetworkError(f"broker {self.leader} is not registered")
        connection = await BrokerConnection.open(*address, timeout_s=self.settings.request_timeout_ms / 1000,
                                                 local_host=self.settings.local_host)
        try:
            # Identify as this registered broker first: the leader serves replica fetches on no
            # other connection (broker/cluster/broker_identity.py). A refusal (the leader has not
            # seen this broker's registration yet) is retried after the backoff.
            await connection.send(BrokerHandshakeRequest(self.settings.broker_id, self.settings.incarnation),
                                  timeout_s=self.settings.request_timeout_ms / 1000)
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _back_off(self, state: _Fetching) -> None:
        state.retry_at = asyncio.get_running_loop().time() + self.settings.backoff_ms / 1000

    # --- truncation ---------------------------------------------------------------------------

    async def _truncate(self, connection: BrokerConnection, states: list[_Fetching]) -> None:
        by_topic: dict[str, list[OffsetForLeaderPartition]] = {}
        for state in states:
            latest = state.log.latest_epoch
            by_topic.setdefault(state.key[0], []).append(OffsetForLeaderPartition(
                state.key[1], -1 if latest is None else latest, state.epoch))
        request = OffsetForLeaderEpochRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()),
                                              self.settings.broker_id)
        response = await connection.send(request, timeout_s=self.settings.request_timeout_ms / 1000)
        answers = {(t.name, p.partition): p for t in response.topics for p in t.partitions}
        for state in states:
            answer = answers.get(state.key)
            if answer is None or answer.error_code:
                reason = "no answer" if answer is None else error_for_code(answer.error_code, answer.error_message)
                log.info("%s-%d: cannot truncate yet (%s)", *state.key, reason)
                self._back_off(state)
                continue
            await self._truncate_to_epoch_end(state, answer.leader_epoch, answer.end_offset)

    async def _truncate_to_epoch_end(self, state: _Fetching, leader_epoch: int, leader_end: int) -> None:
        """KIP-279: truncate to where the leader's answer and this log agree; when this log does
        not know the epoch the leader answered with, cut to where this log's view of it ends and
        ask again with the smaller epoch that is now its latest."""
        partition_log = state.log
        done = True
        if leader_end == UNDEFINED_EPOCH_OFFSET:
            offset = partition_log.high_watermark  # the leader knows no such epoch: keep what was committed
        else:
            follower_epoch, follower_end = partition_log.end_offset_for_epoch(leader_epoch)
            if follower_epoch == leader_epoch or follower_end == UNDEFINED_EPOCH_OFFSET:
                offset = min(leader_end, partition_log.log_end_offset if follower_end < 0 else follower_end)
            else:
                offset, done = follower_end, False
        offset = min(offset, partition_log.log_end_offset)
        async with self.manager.lock(state.key):
            if not self.manager.is_current(state):
                return
            if offset < partition_log.log_end_offset:
                removed = await self.manager.executor.run(self._cut, partition_log, offset)
                log.info("%s-%d: truncated to %d (%d bytes) to match leader %d, epoch %d", *state.key, offset, removed,
                         self.leader, state.epoch)
        state.truncating = not done

    def _cut(self, partition_log: UnifiedLog, offset: int) -> int:
        """Worker thread: truncate, then write the checkpoints so the lowered recovery point holds
        if this broker crashes before its next periodic checkpoint."""
        removed = partition_log.truncate_to(offset)
        self.manager.checkpoint()
        return removed

    async def _rebuild_from_remote(self, state: _Fetching) -> None:
        """The leader holds this follower's next offset only in the remote tier: restart the log
        where the remote log ends (see the module docstring)."""
        partition_log = state.log
        if self.manager.remote_manifest is None:
            log.error("%s-%d: behind the leader's local log start, and this broker has no remote storage configured "
                      "to restart from (remote.log.storage.system.enable)", *state.key)
            self._back_off(state)
            return
        try:
            manifest = await self.manager.executor.run(self.manager.remote_manifest, partition_log)
            snapshot = None
            if self.manager.remote_producer_snapshot is not None:
                snapshot = await self.manager.executor.run(self.manager.remote_producer_snapshot, partition_log, manifest)
        except PymqError as err:
            log.warning("%s-%d: behind the leader's local log start; cannot read the remote manifest: %s", *state.key, err)
            self._back_off(state)
            return
        offset = manifest.log_end_offset
        if offset <= partition_log.log_end_offset:  # an older manifest than the leader's local start
            self._back_off(state)
            return
        async with self.manager.lock(state.key):
            if not self.manager.is_current(state):
                return
            removed = await self.manager.executor.run(self._rebuild, partition_log, manifest, snapshot)
        log.warning("%s-%d: behind the leader's local log start; restarted the log at the remote log end %d "
                    "(manifest version %d, %d local bytes dropped)", *state.key, offset, manifest.version, removed)

    def _rebuild(self, partition_log: UnifiedLog, manifest: PartitionManifest, producer_snapshot: bytes | None) -> int:
        removed = partition_log.rebuild_from_remote(manifest.log_end_offset, manifest.log_start_offset,
                                                    manifest.leader_epochs, producer_snapshot)
        self.manager.checkpoint()
        return removed

    def _start_at(self, partition_log: UnifiedLog, offset: int) -> int:
        removed = partition_log.truncate_fully_and_start_at(offset)
        self.manager.checkpoint()
        return removed

    # --- fetch --------------------------------------------------------------------------------

    async def _fetch(self, connection: BrokerConnection, states: list[_Fetching]) -> None:
        by_topic: dict[str, list[FetchPartition]] = {}
        topic_ids: dict[str, str | None] = {}
        for state in states:
            by_topic.setdefault(state.key[0], []).append(FetchPartition(
                state.key[1], state.log.log_end_offset, self.settings.partition_max_bytes, state.epoch))
            topic_ids[state.key[0]] = state.log.topic_id
        request = FetchRequest(tuple(TopicRequest(t, tuple(ps), topic_ids[t]) for t, ps in by_topic.items()),
                               self.settings.wait_max_ms, 1, self.settings.response_max_bytes, self.settings.broker_id)
        timeout_s = (self.settings.wait_max_ms + self.settings.request_timeout_ms) / 1000
        response = await connection.send(request, timeout_s=timeout_s)
        by_key = {state.key: state for state in states}
        for topic in response.topics:
            for answer in topic.partitions:
                state = by_key.get((topic.name, answer.partition))
                if state is not None:
                    await self._apply(state, answer)

    async def _apply(self, state: _Fetching, answer: FetchPartitionResponse) -> None:
        if answer.error_code:
            await self._fetch_failed(state, answer, error_for_code(answer.error_code, answer.error_message))
            return
        partition_log = state.log
        # A response may end mid-batch (KIP-74: the size limit cuts it): append the whole batches,
        # fetch the rest next time.
        whole = record.complete_prefix(answer.records)  # type: ignore[arg-type]
        if whole:
            async with self.manager.lock(state.key):
                if not self.manager.is_current(state):
                    return
                await self.manager.executor.run(partition_log.append_as_follower, memoryview(answer.records)[:whole])
            if self.manager.throttle is not None and self.settings.broker_id not in state.partition.state.isr:
                self.manager.throttle.consume(whole)
        if self.manager.is_current(state):
            partition_log.update_high_watermark(min(answer.high_watermark, partition_log.log_end_offset))
            self.manager.flush_if_needed(partition_log)

    async def _fetch_failed(self, state: _Fetching, answer: FetchPartitionResponse, err: PymqError) -> None:
        partition_log = state.log
        if isinstance(err, OffsetOutOfRangeError) and 0 <= partition_log.log_end_offset < answer.log_start_offset:
            # The leader deleted what this follower would fetch next (retention while it was
            # away): start over at the leader's log start.
            async with self.manager.lock(state.key):
                if self.manager.is_current(state):
                    await self.manager.executor.run(self._start_at, partition_log, answer.log_start_offset)
                    log.warning("%s-%d: behind the leader's log start %d; restarted the log there", *state.key,
                                answer.log_start_offset)
            return
        if (isinstance(err, OffsetOutOfRangeError)
                and answer.log_start_offset <= partition_log.log_end_offset < answer.high_watermark):
            await self._rebuild_from_remote(state)
            return
        if isinstance(err, OffsetOutOfRangeError):
            state.truncating = True  # past the leader's end: find where the logs agree again
        log.info("%s-%d: fetch from leader %d failed: %s", *state.key, self.leader, err)
        self._back_off(state)
