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
- fetch: reads stop at the high watermark; a fetch waiting for data wakes when it moves.
- replication (docs/cluster.md): a follower's fetch (`replica_log`) reads up to the log end and
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
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.partition import NO_EPOCH, LeaderAndIsr, Partition
from broker.config import LogConfig
from broker.executors import BackgroundExecutors
from broker.log import AppendInfo, LogManager, TopicLogSpec, UnifiedLog
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperation, DelayedOperationPurgatory, ProducePurgatory
from common.errors import (
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
from segment_format.batch_body import now_ms

if TYPE_CHECKING:
    from broker.cluster.session_fence import SessionFence
    from broker.remote_log.remote_log_manager import RemoteLogManager

log = logging.getLogger("pymq.replica_manager")

# Writes a partition's new state (an ISR change) to the metadata store; False if another writer
# changed it first.
IsrWriter = Callable[[Partition, LeaderAndIsr], Awaitable[bool]]


class Followers(Protocol):
    """The replica fetchers (broker/cluster/replica_fetcher.py), as the replica manager drives them."""

    def follow(self, partition: Partition) -> None: ...

    def unfollow(self, key: TopicPartition) -> Awaitable[None]:
        """Stop fetching `key`; done once no append or truncation of it runs any more."""

    async def close(self) -> None:
        """Stop fetching everything."""


class ReplicaManager:
    def __init__(self, broker_id: int, logs: LogManager, writer: LogWriter, fetch_purgatory: DelayedOperationPurgatory,
                 executors: BackgroundExecutors | None = None, remote_logs: RemoteLogManager | None = None) -> None:
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
        self.followers: Followers | None = None  # the replica fetchers, in a cluster
        self._isr_writes: set[asyncio.Task[None]] = set()
        # Called with (partitions now led, partitions no longer led) after every leadership change.
        self.leadership_listeners: list[Callable[[list[Partition], list[Partition]], None]] = []
        # Called with a topic's name once it is deleted, on every broker, whether it hosted the topic
        # or not (the group coordinators drop the offsets their groups committed for it).
        self.deletion_listeners: list[Callable[[str], None]] = []
        self.isr_writer: IsrWriter | None = None  # None: a single broker, whose ISR never changes
        self.fence: SessionFence | None = None  # in a cluster: no appends as leader on a stale view
        self.replica_lag_time_max_ms = 30_000
        self.isr_shrinks = self.isr_expands = 0  # ISR changes stored (metrics)

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
               current_leader_epoch: int = NO_EPOCH) -> AppendInfo | Awaitable[AppendInfo]:
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
        appended = self.writer.append(target.log, data, epoch)
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

    # --- fetch -----------------------------------------------------------------------------

    def replica_log(self, topic: Any, partition: Any, current_leader_epoch: int, replica: int,
                    fetch_offset: int) -> UnifiedLog:
        """The log of a partition this broker leads, for follower `replica`'s fetch from
        `fetch_offset` (which it reads to the log end). Records how far the follower got: the high
        watermark may move and the follower may join the ISR. NOT_LEADER / epoch errors, and
        REPLICA_NOT_AVAILABLE for a broker that is not a replica."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        if target.update_follower_fetch_state(replica, fetch_offset, now_ms()):
            self._advance(target, moved=True)
        expanded = target.isr_to_expand(replica)
        if expanded is not None:
            self._write_isr(target, expanded, f"broker {replica} caught up")
        return target.log

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

    def leader_log(self, topic: Any, partition: Any, current_leader_epoch: int = NO_EPOCH) -> UnifiedLog:
        """The log of a partition this broker leads, for a consumer's read (which stops at the
        high watermark) or an offset lookup; NOT_LEADER / epoch errors otherwise."""
        target = self.partition(topic, partition)
        target.check_leader(current_leader_epoch)
        return target.log

    def park_fetch(self, fetch: DelayedOperation, timeout_s: float) -> None:
        """Park a fetch that wants more than there is; it retries when one of its partitions'
        high watermark moves (or the partition goes away) and answers at `timeout_s` regardless."""
        self.fetch_purgatory.watch(fetch, timeout_s)

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
