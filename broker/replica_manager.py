"""ReplicaManager: the partitions this broker hosts, and the produce and fetch paths through them
(Kafka's ReplicaManager).

Request handlers never touch a log directly: they ask the replica manager to append or read, and
it checks leadership (Partition), appends through the LogWriter, schedules flushes, moves the high
watermark, and parks requests that must wait in the purgatories:

- produce: an append's acknowledgement waits for what the topic promises. With the default flush
  policy that is the write itself. When the policy demands an fsync for this append
  (`flush.messages` reached, `flush.ms=0`), the ack waits for the flush that covers it. Flushes
  are group commits: one fsync covers every append that arrived before it started; appends that
  arrive during it are covered by the next one, which starts as soon as it ends.
- fetch (`read`, Kafka's readFromLog): a consumer's read stops at the high watermark; an offset
  below a tiered log's local start is read from the remote tier through the remote log manager's
  reader; the handler gets a typed LogReadResult per partition. A fetch waiting for data wakes
  when the high watermark moves. ListOffsets (`offset_for_timestamp`) chooses local or remote
  the same way.
- replication (docs/cluster.md): a follower's fetch (`read` with its `replica`) reads up to the log end and
  tells the partition how far the follower got, which moves the high watermark (acks=all
  produces complete) and may add it to the ISR; `check_isr` drops followers that lag. ISR changes
  are written to the metadata store by `isr_writer` (compare-and-set) before they count. acks=all
  needs min.insync.replicas in the ISR when it arrives (NOT_ENOUGH_REPLICAS, nothing written) and
  when it completes (NOT_ENOUGH_REPLICAS_AFTER_APPEND). `become` applies a partition state from
  the metadata store: lead, follow (the replica fetchers take it), or stop hosting.
- a failed fsync takes the log directory offline: every waiting produce gets KAFKA_STORAGE_ERROR,
  and so does every later request for its partitions.

Everything that touches the disk beyond an append or a read (creating and deleting logs,
flushes, retention, checkpoints, leader-epoch files) runs in worker threads, one bounded pool per
kind (broker/executors.py), so a 10,000-partition topic creation does not stall other connections
and a burst of one kind does not queue without bound or delay the others. Loop-local: call from the event-loop thread.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from broker.cluster.partition import NO_EPOCH, LeaderAndIsr, Partition
from broker.cluster.replica_fetcher import Address, FetchSettings, ReplicaFetcherManager
from broker.config import LogConfig
from broker.executors import BackgroundExecutors
from broker.log import AppendInfo, FetchSlice, LogManager, TopicLogSpec, UnifiedLog
from broker.log.unified_log import OffsetMovedToTieredStorageError
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperation, DelayedOperationPurgatory, ProducePurgatory
from broker.remote_log.remote_read_pending import RemoteReadPending
from broker.remote_log.tiering_status import describe_partition
from common.errors import (
    InconsistentTopicIdError,
    InvalidRequestError,
    KafkaStorageError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    PymqError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from common.topic_partition import TopicPartition
from protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, READ_COMMITTED, READ_UNCOMMITTED, code_and_message
from protocol.messages.tiering import TieringPartition
from segment_format import record
from segment_format.batch_body import now_ms
from segment_format.manifest import RemoteSegment

if TYPE_CHECKING:
    from broker.cluster.session_fence import SessionFence
    from broker.remote_log.remote_log_manager import RemoteLogManager

log = logging.getLogger("pymq.replica_manager")

# Writes a partition's new state (an ISR change) to the metadata store; False if another writer
# changed it first.
IsrWriter = Callable[[Partition, LeaderAndIsr], Awaitable[bool]]


@dataclass(frozen=True)
class ClusterReplication:
    """What a broker in a cluster gives its replica manager to replicate: how its replica fetchers
    fetch (`fetch`) and find a leader (`address`), how an ISR change is stored (`isr_writer`),
    the session fence that stops appends as leader on a stale view, and how long a follower may
    lag before it leaves the ISR (replica.lag.time.max.ms). A single broker has none of these:
    it follows nobody and its ISR never changes."""

    fetch: FetchSettings
    address: Address
    isr_writer: IsrWriter
    fence: SessionFence
    replica_lag_time_max_ms: int = 30_000


@dataclass(slots=True)
class LogReadResult:
    """One partition's read for a fetch (Kafka's LogReadResult), which the fetch handler turns
    into the partition's response: the records found (a segment range the server sends with
    sendfile, or bytes read from the remote tier; b"" if none), or the error to answer; the
    high watermark and log start offset (-1 if the partition was not found); `remote_pending`:
    a remote reader worker is loading the offset, and the fetch waits for it."""

    high_watermark: int = -1
    log_start_offset: int = -1
    records: FetchSlice | bytes = b""
    error: PymqError | None = None
    remote_pending: bool = False
    last_stable_offset: int = -1
    aborted_transactions: list[tuple[int, int]] = field(default_factory=list)  # read_committed: (producer, first offset)

    @property
    def size(self) -> int:
        records = self.records
        return len(records) if isinstance(records, bytes) else records.size

    def close(self) -> None:
        """Release the segment range (a read that will not be sent)."""
        if isinstance(self.records, FetchSlice):
            self.records.close()


class ReplicaManager:
    def __init__(self, broker_id: int, logs: LogManager, writer: LogWriter, fetch_purgatory: DelayedOperationPurgatory,
                 executors: BackgroundExecutors | None = None, remote_logs: RemoteLogManager | None = None,
                 cluster: ClusterReplication | None = None) -> None:
        self.broker_id = broker_id
        self.executors = executors or BackgroundExecutors.create()
        self.logs = logs
        self.writer = writer
        self.fetch_purgatory = fetch_purgatory
        self.produce_purgatory = ProducePurgatory()
        self._partitions: dict[TopicPartition, Partition] = {}
        self._flushing: dict[UnifiedLog, bool] = {}  # log -> another flush was asked for meanwhile
        self._checkpoint_wanted = False
        self._checkpointing: asyncio.Task[None] | None = None
        self.remote_logs = remote_logs  # tiered storage, when the broker runs it
        self._isr_writes: set[asyncio.Task[None]] = set()
        # Called with (partitions now led, partitions no longer led) after every leadership change.
        self.leadership_listeners: list[Callable[[list[Partition], list[Partition]], None]] = []
        # Called with a topic's name once it is deleted, on every broker, whether it hosted the topic
        # or not (the group coordinators drop the offsets their groups committed for it).
        self.deletion_listeners: list[Callable[[str], None]] = []
        self.isr_shrinks = self.isr_expands = 0  # ISR changes stored (metrics)
        # In a cluster: the replica fetchers; the ISR writer (None: a single broker, whose ISR never
        # changes); the fence (no appends as leader on a stale view).
        self.followers: ReplicaFetcherManager | None = None
        self.isr_writer: IsrWriter | None = None
        self.fence: SessionFence | None = None
        self.replica_lag_time_max_ms = 30_000
        if cluster is not None:
            self.followers = ReplicaFetcherManager(
                cluster.fetch, self.executors.replication, cluster.address, self.flush_if_needed, logs.checkpoint,
                remote_manifest=None if remote_logs is None else remote_logs.current_manifest,
                remote_producer_snapshot=None if remote_logs is None else remote_logs.producer_snapshot)
            self.isr_writer = cluster.isr_writer
            self.fence = cluster.fence
            self.replica_lag_time_max_ms = cluster.replica_lag_time_max_ms

    # --- partitions ------------------------------------------------------------------------

    def partition(self, topic: Any, partition: Any) -> Partition:
        """The hosted partition; INVALID_REQUEST for ill-typed names, UNKNOWN_TOPIC_OR_PARTITION."""
        if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
            raise InvalidRequestError("topic must be a string and partition an integer")
        found = self._partitions.get((topic, partition))
        if found is None:
            raise UnknownTopicOrPartitionError(f"unknown topic-partition {topic}-{partition}")
        return found

    def hosts(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._partitions

    def hosted(self) -> list[Partition]:
        return list(self._partitions.values())

    async def load(self, specs: dict[str, TopicLogSpec], states: dict[TopicPartition, LeaderAndIsr]) -> None:
        """Open every log of the directory (recovering after a crash) and lead its partitions."""
        logs = await self.executors.logs.run(self.logs.load, specs)
        await self._host(logs.values(), states)

    async def create_partitions(self, topic: str, spec: TopicLogSpec, partitions: list[int],
                                states: dict[TopicPartition, LeaderAndIsr]) -> None:
        """Create the logs of new partitions (all or nothing, in a worker thread) and lead them.
        When this broker leads them all under one epoch (a new topic), the epoch is written with
        the logs, covered by their one filesystem sync, instead of by one thread hop each."""
        epochs = {states[(topic, p)].leader_epoch for p in partitions if states[(topic, p)].leader == self.broker_id}
        if spec.leader_epoch is None and len(epochs) == 1:
            spec = replace(spec, leader_epoch=epochs.pop())
        logs = await self.executors.logs.run(self.logs.create_logs, topic, spec, partitions)
        await self._host(logs, states)

    async def _host(self, logs: Any, states: dict[TopicPartition, LeaderAndIsr]) -> None:
        for partition_log in logs:
            key = (partition_log.topic, partition_log.partition)
            state = states[key]
            partition = Partition(partition_log, self.broker_id, state, self.executors.logs)
            self._partitions[key] = partition
            if state.leader == self.broker_id and partition_log.latest_epoch == state.leader_epoch:
                partition.committed_state(state)  # the epoch is on file already: no thread hop
            elif state.leader == self.broker_id:
                await partition.make_leader(state, now_ms())
            else:
                self._follow(partition, state)
        hosted = [self._partitions[(log_.topic, log_.partition)] for log_ in logs]
        self._leadership_changed([p for p in hosted if p.is_leader], [p for p in hosted if not p.is_leader])

    async def delete_topic(self, topic: str) -> None:
        """Stop hosting `topic` and remove its logs (moved aside at once, in a worker thread); tell
        the deletion listeners. Called on every broker for every deleted topic (by the admin path
        on the broker that deleted it, by the metadata watch on the others)."""
        for listener in self.deletion_listeners:
            listener(topic)
        topic_id = None
        keys = [key for key in self._partitions if key[0] == topic]
        if self.remote_logs is not None:
            self.remote_logs.forget(keys)
        for key in keys:
            topic_id = self._partitions.pop(key).log.topic_id
            self.produce_purgatory.fail(key, UnknownTopicOrPartitionError(f"topic {topic!r} was deleted"))
            self.fetch_purgatory.notify(key)
        await self.executors.logs.run(self.logs.delete_topic, topic)
        if self.remote_logs is not None:
            try:
                await self.executors.logs.run(self.remote_logs.delete_topic, topic, topic_id)
            except PymqError as err:
                log.error("remote data of deleted topic %s not deleted: %s", topic, err)

    async def become(self, topic: str, partition: int, spec: TopicLogSpec, state: LeaderAndIsr) -> None:
        """Apply a partition's state from the metadata store: host it (creating its log) if this
        broker is a replica, then lead it, follow its leader, or take the new ISR; stop hosting
        it if this broker is no longer a replica."""
        key = (topic, partition)
        target = self._partitions.get(key)
        if self.broker_id not in state.replicas:
            if target is not None:
                await self.stop_replica(key)
            return
        if target is None:
            await self.create_partitions(topic, spec, [partition], {key: state})
            return
        if state.leader == self.broker_id:
            if target.is_leader and target.leader_epoch == state.leader_epoch:
                self._advance(target, moved=target.committed_state(state))  # the controller changed the ISR
                return
            if self.followers is not None:
                await self.followers.unfollow(key)
            self._advance(target, moved=await target.make_leader(state, now_ms()))
            log.info("%s-%d: leader, epoch %d, ISR %s", topic, partition, state.leader_epoch, list(state.isr))
            self._leadership_changed([target], [])
            return
        was_leader = target.is_leader
        if not was_leader and target.leader_epoch == state.leader_epoch and target.state.leader == state.leader:
            target.committed_state(state)  # the ISR moved: nothing for a follower to do
            return
        self._follow(target, state)
        log.info("%s-%d: follower of %d, epoch %d", topic, partition, state.leader, state.leader_epoch)
        if was_leader:
            self._leadership_changed([], [target])

    async def stop_following(self) -> None:
        """A clean stop begins: close the replica fetchers, and fetch nothing from now on (not for
        partitions this broker becomes a follower of later either). A leader would take a broker
        that fetches back into its ISR, and its acks=all produces would wait for a broker that goes."""
        followers, self.followers = self.followers, None
        if followers is not None:
            await followers.close()

    def _follow(self, target: Partition, state: LeaderAndIsr) -> None:
        """Become a follower: acks waiting here can no longer be given, consumers must go to the
        new leader, and the replica fetchers take the partition (truncating it first)."""
        key = (target.topic, target.partition)
        target.make_follower(state)
        self.produce_purgatory.fail(key, NotLeaderError(
            f"{target.topic}-{target.partition}: leadership moved to broker {state.leader} before the records were "
            "acknowledged"))
        self.fetch_purgatory.notify(key)
        if self.followers is not None and state.leader >= 0:
            self.followers.follow(target)

    def _leadership_changed(self, led: list[Partition], unled: list[Partition]) -> None:
        """Tell who serves only leaders (tiering, the group coordinator) what this broker now
        leads and no longer leads."""
        if self.remote_logs is not None:
            self.remote_logs.on_leadership_change([(p.log, p.leader_epoch) for p in led], [p.log for p in unled])
        for listener in self.leadership_listeners:
            listener(led, unled)

    async def stop_replica(self, key: TopicPartition) -> None:
        """This broker is no longer a replica (the partition was moved away): stop fetching and
        serving it and delete its log."""
        target = self._partitions.pop(key)
        if self.followers is not None:
            await self.followers.unfollow(key)
        self.produce_purgatory.fail(key, NotLeaderError(f"{key[0]}-{key[1]} moved away from broker {self.broker_id}"))
        self.fetch_purgatory.notify(key)
        if self.remote_logs is not None:
            self.remote_logs.forget([key])
        if target.is_leader:
            self._leadership_changed([], [target])
        await self.executors.logs.run(self.logs.delete_partition, key[0], key[1])

    def leader_logs(self) -> list[UnifiedLog]:
        """The logs of the partitions led here (what the remote log manager tiers)."""
        return [p.log for p in self._partitions.values() if p.is_leader]

    def update_config(self, topic: str, config: LogConfig) -> None:
        self.logs.update_config(topic, config)

    # --- produce ---------------------------------------------------------------------------

    def append(self, topic: Any, partition: Any, data: memoryview, acks: int, timeout_ms: int,
               current_leader_epoch: int = NO_EPOCH, coordinator: bool = False) -> AppendInfo | Awaitable[AppendInfo]:
        """Append to a partition this broker leads. Returns the AppendInfo when the append is
        acknowledged at once, else an awaitable of it (queued on the log writer, or waiting for
        the flush or replication `acks` needs). Raises PymqError for what fails at once."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        if self.fence is not None:  # a leader that may have been declared dead acknowledges nothing
            self.fence.check_leader(target.topic, target.partition)
        if acks == -1:
            self._check_min_isr(target, NotEnoughReplicasError, "nothing was written")
        epoch = target.leader_epoch
        appended = self.writer.append(target.log, data, epoch, coordinator)
        if isinstance(appended, AppendInfo):
            return self._appended(target, epoch, appended, acks, timeout_ms)
        return self._append_queued(target, epoch, appended, acks, timeout_ms)

    async def _append_queued(self, target: Partition, epoch: int, pending: Awaitable[AppendInfo], acks: int,
                             timeout_ms: int) -> AppendInfo:
        try:
            info = await pending
        except KafkaStorageError:
            if self._partitions.get((target.topic, target.partition)) is not target:
                # The topic was deleted while the append waited on the writer thread: the log is
                # closed because the partition is gone, not because the disk failed.
                raise UnknownTopicOrPartitionError(
                    f"{target.topic}-{target.partition} was deleted while the append was queued") from None
            raise
        outcome = self._appended(target, epoch, info, acks, timeout_ms)
        return outcome if isinstance(outcome, AppendInfo) else await outcome

    def _appended(self, target: Partition, epoch: int, info: AppendInfo, acks: int,
                  timeout_ms: int) -> AppendInfo | Awaitable[AppendInfo]:
        if not target.is_leader or target.leader_epoch != epoch:
            # Leadership moved while the append waited on the writer (a controlled shutdown, an
            # election): the purgatory was failed before this produce could park in it, and the
            # new leader's followers truncate what was written here. Parked, it waited for its timeout.
            raise NotLeaderError(f"{target.topic}-{target.partition}: leadership moved to broker "
                                 f"{target.state.leader} (epoch {target.leader_epoch}) before the records were acknowledged")
        if target.log.needs_flush(now_ms()):
            self._flush(target.log)
        self._advance(target)
        if len(target.state.replicas) > 1:
            self.fetch_purgatory.notify((target.topic, target.partition))  # followers waiting for data
        if acks == 0 or self._satisfied(target, info.next_offset, acks) is True:
            return info
        # Parked now, in the turn that found it unanswered: the handler awaits a request's
        # partitions one after another, and a `complete` before it got to this one would be lost.
        parked = self.produce_purgatory.watch((target.topic, target.partition), info.next_offset, acks,
                                              timeout_ms / 1000)
        return self._acknowledged(target, info, parked, acks, timeout_ms)

    def append_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int, committed: bool,
                      coordinator_epoch: int, timeout_ms: int) -> AppendInfo | Awaitable[AppendInfo]:
        """Append a transaction's commit or abort marker (a control batch) to a partition this
        broker leads, acknowledged as acks=all (Kafka's WriteTxnMarkers): the transaction
        coordinator counts it written only once every in-sync replica has it. Raises PymqError
        for what fails at once (InvalidProducerEpochError, TransactionCoordinatorFencedError from
        the log: a marker older than what the partition has seen)."""
        target = self.partition(topic, partition)
        target.check_leader()
        if self.fence is not None:
            self.fence.check_leader(target.topic, target.partition)
        self._check_min_isr(target, NotEnoughReplicasError, "no marker was written")
        epoch = target.leader_epoch
        info = target.log.append_transaction_marker(producer_id, producer_epoch, committed, coordinator_epoch, epoch)
        return self._appended(target, epoch, info, -1, timeout_ms)

    @staticmethod
    def _check_min_isr(target: Partition, error: type[PymqError], what: str) -> None:
        needed = target.log.config.min_insync_replicas
        if len(target.state.isr) < needed:
            raise error(f"{target.topic}-{target.partition} has {len(target.state.isr)} in-sync replicas "
                        f"{list(target.state.isr)}, min.insync.replicas is {needed}: {what}")

    @staticmethod
    async def _acknowledged(target: Partition, info: AppendInfo, parked: asyncio.Future[None], acks: int,
                            timeout_ms: int) -> AppendInfo:
        try:
            await parked
        except TimeoutError:
            raise RequestTimedOutError(
                f"{target.topic}-{target.partition}: offsets up to {info.last_offset} were written but not "
                f"{'flushed' if acks == 1 else 'committed'} within {timeout_ms} ms") from None
        return info

    @classmethod
    def _satisfied(cls, target: Partition, required_offset: int, acks: int) -> bool | PymqError:
        """acks=1: the leader's write, fsynced if the flush policy demands it; acks=all: the
        high watermark (every ISR member has it, and it is as durable as the policy demands),
        with min.insync.replicas in the ISR then (else the error to answer)."""
        if acks == -1:
            if target.log.high_watermark < required_offset:
                return False
            try:
                cls._check_min_isr(target, NotEnoughReplicasAfterAppendError, "the records were written but not replicated")
            except PymqError as err:
                return err
            return True
        return target.log.durable_end_offset >= required_offset

    def _advance(self, target: Partition, moved: bool = False) -> None:
        """After an append, a flush, a follower's fetch or an ISR change (`moved`: it moved the
        high watermark already): move the high watermark, wake what waits on it. Waiting produces
        are checked again whatever moved (Kafka re-checks them on every ISR change too)."""
        key = (target.topic, target.partition)
        if target.maybe_increment_high_watermark() or moved:
            self.fetch_purgatory.notify(key)
        self.produce_purgatory.complete(key, lambda offset, acks: self._satisfied(target, offset, acks))

    # --- fetch and offset lookups: the read path ---------------------------------------------

    def read(self, topic: Any, partition: Any, fetch_offset: int, max_bytes: int, *, min_one: bool = True,
             current_leader_epoch: int = NO_EPOCH, topic_id: str | None = None,
             replica: int | None = None, isolation_level: int = READ_UNCOMMITTED) -> LogReadResult:
        """One partition's read for a fetch (Kafka's `readFromLog`), never raising: a consumer's
        (`replica` None) stops at the high watermark; follower `replica`'s reads to the log end
        and records how far the follower got (`_follower_fetched`). Up to `max_bytes`, or the
        first whole batch when `min_one` (KIP-74: the first partition with data may exceed its
        budget); nothing when `max_bytes` <= 0 and not `min_one`. An offset below the local log
        start is read from the remote tier for a consumer (a follower that far behind starts
        from the local log start, replica_fetcher.py). A topic id names one incarnation of the
        topic: INCONSISTENT_TOPIC_ID when the log is another one. A read_committed consumer
        (`isolation_level`) stops at the last stable offset and gets the aborted transactions its
        records may hold (local and remote transaction indexes)."""
        result = LogReadResult()
        committed = isolation_level == READ_COMMITTED and replica is None
        try:
            target = self.partition(topic, partition)
            target.check_leader(current_leader_epoch)
            if replica is not None:
                self._follower_fetched(target, replica, fetch_offset)
            partition_log = target.log
            _check_topic_id(partition_log, topic_id)
            result.high_watermark = partition_log.high_watermark
            result.log_start_offset = partition_log.log_start_offset
            result.last_stable_offset = partition_log.last_stable_offset
            if max_bytes <= 0 and not min_one:
                return result
            max_bytes = max(max_bytes, 1)
            upper = partition_log.log_end_offset if replica is not None else (
                result.last_stable_offset if committed else None)
            try:
                records: FetchSlice | bytes = partition_log.read(fetch_offset, max_bytes, upper)
            except OffsetMovedToTieredStorageError:
                if replica is not None:
                    raise
                records = self._read_remote(partition_log, fetch_offset, max_bytes, upper)
            if committed and (len(records) if isinstance(records, bytes) else records.size):
                result.aborted_transactions = self._aborted_transactions(partition_log, fetch_offset,
                                                                         result.last_stable_offset)
        except RemoteReadPending:
            result.remote_pending = True
            return result
        except PymqError as err:
            result.error = err
            return result
        if len(records) if isinstance(records, bytes) else records.size:
            result.records = records
        elif isinstance(records, FetchSlice):
            records.close()
        return result

    def _read_remote(self, partition_log: UnifiedLog, offset: int, max_bytes: int,
                     upper: int | None = None) -> FetchSlice | bytes:
        """`offset` (below the local log start) from the remote tier; past the remote log's end
        (a compaction gap up to the local start), the local log from its start; batches from
        `upper` on (a read_committed consumer's last stable offset) left out. RemoteReadPending
        while a remote reader worker loads it (the fetch waits; `remote_read_ready` wakes it)."""
        remote = self.remote_logs
        if remote is None:
            raise OffsetMovedToTieredStorageError(f"{partition_log}: offset {offset} is below the local log start "
                                                  "and this broker does not run tiered storage")
        data = remote.reader.read(partition_log.topic, partition_log.partition,
                                  remote.manifest(partition_log.topic, partition_log.partition), offset, max_bytes)
        if data and upper is not None:
            data = data[:_batches_below(data, upper)]
        return data if data else partition_log.read(partition_log.local_log_start_offset, max_bytes, upper)

    def _aborted_transactions(self, partition_log: UnifiedLog, offset: int, upper: int) -> list[tuple[int, int]]:
        """The aborted transactions overlapping [offset, upper): the local segments' indexes and,
        for an offset below the local log start, the remote tier's (held in memory), once each."""
        found = partition_log.collect_aborted_transactions(offset, upper)
        if offset < partition_log.local_log_start_offset and self.remote_logs is not None:
            found = self.remote_logs.aborted_transactions(partition_log.topic, partition_log.partition, offset,
                                                          upper) + found
        return list(dict.fromkeys(found))

    def _follower_fetched(self, target: Partition, replica: int, fetch_offset: int) -> None:
        """Follower `replica` fetches from `fetch_offset`, so it has everything below it: the
        high watermark may move and the follower may join the ISR."""
        if target.update_follower_fetch_state(replica, fetch_offset, now_ms()):
            self._advance(target, moved=True)
        expanded = target.isr_to_expand(replica)
        if expanded is not None:
            self._write_isr(target, expanded, f"broker {replica} caught up")

    def offset_for_timestamp(self, topic: Any, partition: Any, timestamp: int, current_leader_epoch: int = NO_EPOCH,
                             isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int] | Future[tuple[int, int]]:
        """ListOffsets (Kafka's `fetchOffsetForTimestamp`): (offset, timestamp) of LATEST_TIMESTAMP
        (the high watermark: what a consumer can read), EARLIEST_TIMESTAMP (the log start, the
        remote log's for a tiered log) or the first record at or after `timestamp` ((-1, -1) if
        none). A time the remote segments may hold (their manifest's max timestamps tell without a
        read) is looked up there by a remote reader worker: a Future of the answer (or of its
        PymqError). Raises PymqError (NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, ...) at once."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        partition_log = target.log
        remote = self.remote_logs
        if timestamp < 0 or remote is None or not partition_log.tiered:
            return _local_offset_for(partition_log, timestamp, isolation_level)
        manifest = remote.manifest(partition_log.topic, partition_log.partition)
        if manifest is None or not manifest.prune(partition_log.log_start_offset, None, timestamp, None):
            return _local_offset_for(partition_log, timestamp)
        answer: Future[tuple[int, int]] = Future()

        def found(lookup: Future[tuple[int, int] | None]) -> None:
            try:
                hit = lookup.result()
                # None: the manifest's max timestamp was a record below the log start
                answer.set_result(hit if hit is not None else _local_offset_for(partition_log, timestamp))
            except BaseException as err:
                answer.set_exception(err)

        remote.reader.offset_for_timestamp(partition_log.topic, partition_log.partition, manifest,
                                           timestamp).add_done_callback(found)
        return answer

    def end_offset_for_epoch(self, topic: Any, partition: Any, current_leader_epoch: int,
                             leader_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch (a follower truncating): the largest epoch <= `leader_epoch` this
        leader's log knows and the end offset of it."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        return target.log.end_offset_for_epoch(leader_epoch)

    def leader_log(self, topic: Any, partition: Any, current_leader_epoch: int = NO_EPOCH) -> UnifiedLog:
        """The log of a partition this broker leads (the group coordinator replays
        __consumer_offsets from it); NOT_LEADER / epoch errors otherwise."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        return target.log

    def park_fetch(self, fetch: DelayedOperation, timeout_s: float) -> None:
        """Park a fetch that wants more than there is; it retries when one of its partitions'
        high watermark moves (or the partition goes away) and answers at `timeout_s` regardless."""
        self.fetch_purgatory.watch(fetch, timeout_s)

    # --- tiering -------------------------------------------------------------------------

    def describe_tiering(self) -> dict[str, list[TieringPartition]]:
        """DescribeTiering: per topic led here, its partitions' local and remote ranges (or the
        error of a log closed under us, e.g. its directory offline), in partition order."""
        found: dict[str, list[TieringPartition]] = {}
        for target in sorted(self._partitions.values(), key=lambda p: p.partition):
            if not target.is_leader:
                continue
            try:
                status = describe_partition(target.log, self.remote_logs)
            except PymqError as err:
                status = TieringPartition(target.partition, *code_and_message(err))
            found.setdefault(target.topic, []).append(status)
        return found

    async def replace_remote_segments(self, topic: Any, partition: Any, topic_id: str | None, expected_version: int,
                                      replaced: Sequence[tuple[int, str]], segments: Sequence[RemoteSegment]) -> int:
        """The compaction job's swap of remote segments, committed by this partition's leader
        (RemoteLogManager.replace_segments, on a worker thread: it reads the new objects back);
        the manifest version committed. INVALID_REQUEST for a partition that is not tiered."""
        target = self.partition(topic, partition)
        target.check_leader(NO_EPOCH)
        partition_log = target.log
        _check_topic_id(partition_log, topic_id)
        if self.remote_logs is None or not partition_log.tiered:
            raise InvalidRequestError(f"{partition_log} is not tiered: it has no remote segments to replace")
        manifest = await self.executors.logs.run(self.remote_logs.replace_segments, partition_log, expected_version,
                                                 replaced, segments)
        return manifest.version

    # --- the ISR ---------------------------------------------------------------------------

    def check_isr(self) -> None:
        """The ISR check (every replica.lag.time.max.ms / 2): drop followers that lag."""
        if self.isr_writer is None:
            return
        now = now_ms()
        for target in list(self._partitions.values()):
            shrunk = target.isr_to_shrink(now, self.replica_lag_time_max_ms)
            if shrunk is not None:
                lagging = sorted(set(target.state.isr) - set(shrunk))
                self._write_isr(target, shrunk, f"broker(s) {lagging} did not catch up within "
                                                f"{self.replica_lag_time_max_ms} ms")

    def _write_isr(self, target: Partition, isr: tuple[int, ...], why: str) -> None:
        """Write the ISR change (one at a time per partition); it counts once stored."""
        if self.isr_writer is None:
            return
        target.pending_isr = isr
        task = asyncio.get_running_loop().create_task(self._store_isr(target, target.with_isr(isr), why))
        self._isr_writes.add(task)
        task.add_done_callback(self._isr_writes.discard)

    async def _store_isr(self, target: Partition, state: LeaderAndIsr, why: str) -> None:
        assert self.isr_writer is not None
        try:
            stored = await self.isr_writer(target, state)
        except PymqError as err:
            log.warning("%s-%d: ISR change to %s not stored: %s", target.topic, target.partition, list(state.isr), err)
            stored = False
        if self._partitions.get((target.topic, target.partition)) is not target or target.leader_epoch != state.leader_epoch:
            return
        if not stored:
            target.pending_isr = None  # the store's state arrives through the metadata listener
            return
        log.info("%s-%d: ISR %s -> %s (%s)", target.topic, target.partition, list(target.state.isr), list(state.isr), why)
        if len(state.isr) < len(target.state.isr):
            self.isr_shrinks += 1
        else:
            self.isr_expands += 1
        self._advance(target, moved=target.committed_state(state))

    # --- flushes ---------------------------------------------------------------------------

    def schedule_flushes(self) -> None:
        """The flush scheduler's tick: flush every log whose flush.ms passed or that rolled."""
        for partition_log in self.logs.logs_needing_flush(now_ms()):
            self._flush(partition_log)

    def _flush(self, partition_log: UnifiedLog) -> None:
        """Group commit: at most one flush per log runs; asked again meanwhile, it runs once more
        right after, covering everything appended during the first."""
        if partition_log in self._flushing:
            self._flushing[partition_log] = True
            return
        self._flushing[partition_log] = False
        task = asyncio.get_running_loop().create_task(self.executors.flush.run(partition_log.flush))
        task.add_done_callback(lambda t: self._flushed(partition_log, t))

    def _flushed(self, partition_log: UnifiedLog, task: asyncio.Task[bool]) -> None:
        again = self._flushing.pop(partition_log, False)
        if task.cancelled():
            return  # the event loop is shutting down: the flush's thread finishes on its own
        err = task.exception()
        if err is not None:
            self._fail_directory(err if isinstance(err, KafkaStorageError) else KafkaStorageError(f"flush failed: {err!r}"))
            return
        target = self._partitions.get((partition_log.topic, partition_log.partition))
        if target is not None:
            self._advance(target)
        if task.result():
            # A sealed segment became durable: checkpoint the recovery point now, so a crash
            # re-validates only the tail (the checkpoint is one file for every partition).
            self.request_checkpoint()
        if again or partition_log.needs_flush(now_ms()):
            self._flush(partition_log)

    def _fail_directory(self, err: KafkaStorageError) -> None:
        """The log directory is offline: every waiting produce of its partitions fails."""
        log.error("flush failed, log directory %s offline: %s", self.logs.log_dir, err)
        self.logs.failure.fail(err)
        for key in self.produce_purgatory.partitions():
            self.produce_purgatory.fail(key, KafkaStorageError(f"log directory offline: {err}"))
        for key in list(self._partitions):
            self.fetch_purgatory.notify(key)

    def flush_if_needed(self, partition_log: UnifiedLog) -> None:
        """After a follower's append: flush as the topic's policy says (followers keep it too)."""
        if partition_log.needs_flush(now_ms()):
            self._flush(partition_log)

    @property
    def flushes_in_flight(self) -> int:
        return len(self._flushing)

    # --- checkpoints and retention ---------------------------------------------------------

    def request_checkpoint(self) -> None:
        """Write the directory's offset checkpoints soon, in a worker thread, one write at a time."""
        self._checkpoint_wanted = True
        if self._checkpointing is None:
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint_loop())

    async def _checkpoint_loop(self) -> None:
        try:
            while self._checkpoint_wanted:
                self._checkpoint_wanted = False
                await self.executors.checkpoint.run(self.logs.checkpoint)
        except KafkaStorageError as err:
            log.error("checkpoint failed: %s", err)
        finally:
            self._checkpointing = None

    async def run_retention(self, delete_delay_ms: int) -> int:
        now = now_ms()
        deleted = await self.executors.retention.run(self.logs.run_retention, now)
        await self.executors.retention.run(self.logs.purge_deleted, now, delete_delay_ms)
        if deleted:
            log.info("retention deleted %d segments", deleted)
            self.request_checkpoint()  # the log start offsets moved
        return deleted

    async def wait_idle(self) -> None:
        """Until no flush or checkpoint is running (before a clean stop closes the logs)."""
        while self._flushing or self._checkpointing is not None:
            await asyncio.sleep(0.005)


def _check_topic_id(partition_log: UnifiedLog, topic_id: str | None) -> None:
    """A request naming a topic id acts only on that incarnation of the topic: the same name's
    log of a re-created topic holds other records at the same offsets (Kafka's Fetch v13). A log
    without an id (written before topics had ids) is not checked."""
    if topic_id is None or partition_log.topic_id is None or topic_id == partition_log.topic_id:
        return
    raise InconsistentTopicIdError(f"{partition_log.topic}-{partition_log.partition} is topic id "
                                   f"{partition_log.topic_id}, not {topic_id}: the topic was deleted and re-created")


def _batches_below(data: bytes, end: int) -> int:
    """How many leading bytes of `data` (whole batches) hold batches based below `end`."""
    position = 0
    while position + record.HEADER_SIZE <= len(data):
        header = record.read_header(data, position)
        if header.base_offset >= end:
            break
        position += header.size
    return min(position, len(data))


def _local_offset_for(partition_log: UnifiedLog, timestamp: int, isolation_level: int = READ_UNCOMMITTED) -> tuple[int, int]:
    """ListOffsets from the local log (the log start offset is the remote log's for a tiered log);
    latest is the last stable offset for a read_committed consumer."""
    if timestamp == LATEST_TIMESTAMP:
        if isolation_level == READ_COMMITTED:
            return partition_log.last_stable_offset, -1
        return partition_log.high_watermark, -1
    if timestamp == EARLIEST_TIMESTAMP:
        return partition_log.log_start_offset, -1
    if timestamp < 0:  # ListOffsetsRequest.from_control refuses these: a caller that skipped it
        raise InvalidRequestError(f"ListOffsets timestamp {timestamp}: -1 (latest), -2 (earliest) or a time in ms >= 0")
    found = partition_log.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)
