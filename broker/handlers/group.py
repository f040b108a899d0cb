"""Group handler: the runtime around the pure `GroupCoordinator` (docs/architecture.md, Coordinator).

It does what the state machine cannot: it creates `__consumer_offsets` on first use (compacted,
`offsets.topic.num.partitions` partitions, as Kafka does on the first FindCoordinator), replays
the partitions this broker leads into the coordinator when it starts, appends the records a
`Result` asks for (acks=all: an acknowledged commit is as durable as the topic's flush policy
makes any committed record) before calling their `complete`, answers parked JoinGroup /
SyncGroup requests through futures, and drives the coordinator's timers (sessions, rebalance
deadlines) and offset expiry.

The coordinator of a group is the leader of its partition of `__consumer_offsets`, so none of
this changes when partitions move between brokers: leading a partition means replaying it,
losing it means `unload`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from broker import background
from broker.cluster.partition import Partition
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from broker.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from broker.coordinator.group_records import (
    OFFSETS_TOPIC,
    RecordKey,
    RecordValue,
    check_group_id,
    decode_record,
    encode_key,
    encode_value,
)
from broker.coordinator.results import Append, Result
from broker.handlers.slices import answer_in_slices
from broker.log import UnifiedLog
from broker.replica_manager import ReplicaManager
from common.errors import (
    CoordinatorNotAvailableError,
    CorruptMessageError,
    FencedLeaderEpochError,
    InvalidRequestError,
    NotCoordinatorError,
    NotLeaderError,
    PymqError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from protocol.messages.base import Message, code_and_message
from protocol.messages.group import (
    GROUP_KEY_TYPE,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
)
from segment_format import batch_body, record
from segment_format.batch_body import now_ms

log = logging.getLogger("pymq.group_handler")

APPEND_TIMEOUT_MS = 5_000  # Kafka's offsets.commit.timeout.ms
TICK_S = 0.05  # timer resolution of sessions and rebalance deadlines
READ_CHUNK_BYTES = 4 << 20


class GroupHandler:
    """Loop-local: call from the event-loop thread only."""

    def __init__(self, config: BrokerConfig, registry: TopicRegistry, replicas: ReplicaManager,
                 create_topic: Any, address_of: Callable[[int], tuple[str, int] | None] = lambda broker: None) -> None:
        self.config = config
        self.address_of = address_of  # another broker's host and port (a coordinator elsewhere)
        self.registry = registry
        self.replicas = replicas
        self.broker_id: int = config["broker.id"]
        self.coordinator = GroupCoordinator(GroupConfig.of(config))
        self._create_topic = create_topic  # async (name, partitions, configs) -> None: the admin path
        self._creating: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._waiting: set[asyncio.Future[Message]] = set()  # requests parked until a rebalance or an append
        self._loads: dict[int, asyncio.Task[None]] = {}  # replays of __consumer_offsets partitions in progress
        replicas.leadership_listeners.append(self.on_leadership_change)
        replicas.deletion_listeners.append(self.on_topic_deleted)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, advertised: Any) -> None:
        """Wait for the replays of the `__consumer_offsets` partitions this broker leads (begun
        as the replica manager loaded them), then run the timers."""
        self._advertised = advertised
        await self._loaded()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(background.every("group-timers", TICK_S, self._tick)),
                       loop.create_task(background.every("offset-expiry", self.config["offsets.retention.check.interval.ms"] / 1000,
                                                         self._expire_offsets))]

    async def stop(self) -> None:
        """Stop the timers, let the appends in flight finish (their requests are answered), then
        answer every request still parked (a JoinGroup waiting for its rebalance) NOT_COORDINATOR:
        its client finds the coordinator again instead of waiting on a broker that is stopping."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._pending, *self._loads.values(), return_exceptions=True)
        for token in list(self._waiting):
            if not token.done():
                token.set_exception(NotCoordinatorError("the group coordinator is shutting down"))

    async def _loaded(self) -> None:
        """Until the replays begun so far are done."""
        await asyncio.gather(*self._loads.values(), return_exceptions=True)

    def on_leadership_change(self, led: list[Partition], unled: list[Partition]) -> None:
        """Partitions of `__consumer_offsets` this broker now leads (their groups are replayed and
        served here; until then they answer COORDINATOR_LOAD_IN_PROGRESS) or no longer leads
        (their groups go, and their members find the new coordinator)."""
        for target in unled:
            if target.topic == OFFSETS_TOPIC:
                self._loads.pop(target.partition, None)
                self._apply(self.coordinator.unload(target.partition))
        for target in led:
            if target.topic == OFFSETS_TOPIC:
                self.coordinator.begin_load(target.partition)
                task = asyncio.get_running_loop().create_task(self._load(target.partition))
                self._loads[target.partition] = task
                task.add_done_callback(lambda t, p=target.partition: self._loads.pop(p, None) if self._loads.get(p) is t else None)

    async def _load(self, partition: int) -> None:
        """Replay one partition (its load begun by `on_leadership_change`). If its records cannot
        be read, its groups stay unavailable (COORDINATOR_LOAD_IN_PROGRESS) rather than
        coordinated from a guessed state."""
        try:
            partition_log = self.replicas.leader_log(OFFSETS_TOPIC, partition)
        except PymqError as err:
            log.info("not replaying %s-%d: %s", OFFSETS_TOPIC, partition, err)
            return
        started = now_ms()
        try:
            count = await self.replicas.executors.group_load.run(self._replay, partition, partition_log)
        except KeyError:
            return  # unloaded while it replayed: leadership moved on
        except PymqError as err:
            log.error("cannot replay %s-%d; its groups stay unavailable: %s", OFFSETS_TOPIC, partition, err)
            return
        if self._loads.get(partition) is not asyncio.current_task():
            return  # leadership moved on while it replayed
        self.coordinator.finish_load(partition, now_ms())
        if count:
            log.info("replayed %d records of %s-%d in %d ms", count, OFFSETS_TOPIC, partition, now_ms() - started)

    def _replay(self, partition: int, partition_log: UnifiedLog) -> int:
        """Worker thread: feed every record of the partition to the coordinator (only its loading
        state for this partition is touched until `finish_load`, on the loop)."""
        count = 0
        for key, value in read_records(partition_log):
            self.coordinator.replay(partition, key, value)
            count += 1
        return count

    def _tick(self) -> None:
        """Session timeouts, rebalance deadlines, delayed joins: whatever is due now."""
        deadline = self.coordinator.next_deadline()
        if deadline is not None and deadline <= now_ms():
            self._apply(self.coordinator.tick(now_ms()))

    def _expire_offsets(self) -> None:
        self._apply(self.coordinator.expire_offsets(now_ms()))

    def on_topic_deleted(self, topic: str) -> None:
        """Drop what this broker's groups committed for a deleted topic: a topic re-created under
        the same name is another topic, and an old offset would make its consumers skip records."""
        self._apply(self.coordinator.delete_topic_offsets(topic))

    # -- requests ----------------------------------------------------------------------------------

    async def find_coordinator(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
        try:
            if request.key_type != GROUP_KEY_TYPE:
                raise InvalidRequestError("transaction coordinators arrive with transactions (key_type 1)")
            check_group_id(request.key)
            await self._ensure_offsets_topic()
            partition = self.coordinator.partition_of(request.key)
            leader = self.registry.get(OFFSETS_TOPIC).partitions[partition].leader
            address = self._advertised() if leader == self.broker_id else self.address_of(leader)
            if address is None:
                raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC}-{partition} has no live leader (broker {leader})")
        except PymqError as err:
            return FindCoordinatorResponse(*code_and_message(err))
        host, port = address
        return FindCoordinatorResponse(node_id=leader, host=host, port=port)



    async def _ensure_offsets_topic(self) -> None:
        if OFFSETS_TOPIC in self.registry.topics:
            return
        if self._creating is None:
            self._creating = asyncio.get_running_loop().create_task(self._create_offsets_topic())
        try:
            await asyncio.shield(self._creating)
        finally:
            if self._creating is not None and self._creating.done():
                self._creating = None

    async def _create_offsets_topic(self) -> None:
        configs = {"cleanup.policy": "compact", "segment.bytes": self.config["offsets.topic.segment.bytes"]}
        try:
            await self._create_topic(OFFSETS_TOPIC, self.config["offsets.topic.num.partitions"], configs)
        except TopicAlreadyExistsError:
            pass
        await self._loaded()
        log.info("created %s with %d partitions", OFFSETS_TOPIC, self.config["offsets.topic.num.partitions"])

    def join_group(self, request: JoinGroupRequest) -> Message | Awaitable[Message]:
        return self._parked(lambda token: self.coordinator.join_group(request, token, now_ms()))

    def sync_group(self, request: SyncGroupRequest) -> Message | Awaitable[Message]:
        return self._parked(lambda token: self.coordinator.sync_group(request, token, now_ms()))

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return self.coordinator.heartbeat(request, now_ms())

    def leave_group(self, request: LeaveGroupRequest) -> LeaveGroupResponse:
        response, effects = self.coordinator.leave_group(request, now_ms())
        self._apply(effects)
        return response

    def offset_commit(self, request: OffsetCommitRequest) -> Message | Awaitable[Message]:
        return self._parked(lambda token: self.coordinator.commit_offsets(request, token, now_ms(), self._partition_exists))

    def offset_fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        return self.coordinator.fetch_offsets(request)

    def offset_delete(self, request: OffsetDeleteRequest) -> Message | Awaitable[Message]:
        return self._parked(lambda token: self.coordinator.delete_offsets(request, token, now_ms()))

    def list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        return self.coordinator.list_groups(request)

    def describe_groups(self, request: DescribeGroupsRequest) -> DescribeGroupsResponse | Awaitable[DescribeGroupsResponse]:
        """Many groups are described in slices (`answer_in_slices`): each is as it was at its turn."""
        return answer_in_slices(request.groups, self.coordinator.describe_group,
                                lambda groups: DescribeGroupsResponse(tuple(groups)))

    def delete_groups(self, request: DeleteGroupsRequest) -> Message | Awaitable[Message]:
        return self._parked(lambda token: self.coordinator.delete_groups(request, token, now_ms()))

    def _partition_exists(self, topic: str, partition: int) -> bool:
        info = self.registry.topics.get(topic)
        return info is not None and 0 <= partition < info.partition_count

    # -- applying results --------------------------------------------------------------------------

    def _parked(self, call: Any) -> Message | Awaitable[Message]:
        """Run a coordinator call whose answer may come later: the token is a future the Result
        that answers it resolves (at once, or after an append, or when a rebalance completes)."""
        token: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._apply(call(token))
        if token.done():
            return token.result()
        self._waiting.add(token)
        token.add_done_callback(self._waiting.discard)
        return token

    def _apply(self, result: Result) -> None:
        for token, response in result.replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(response)
        for append in result.appends:
            self._start_append(append)

    def _start_append(self, append: Append) -> None:
        """Append now (in call order, so a partition's records keep the coordinator's order), and
        complete once acknowledged."""
        try:
            pending = self.replicas.append(OFFSETS_TOPIC, append.partition, memoryview(encode_records(append.records)),
                                           acks=-1, timeout_ms=APPEND_TIMEOUT_MS)
        except Exception as err:
            self._apply(append.complete(append_error(err), now_ms()))
            return
        if not isinstance(pending, Awaitable):
            self._apply(append.complete(None, now_ms()))
            return
        task = asyncio.get_running_loop().create_task(self._finish_append(append, pending))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _finish_append(self, append: Append, pending: Awaitable[Any]) -> None:
        """Complete the coordinator's step with the append's outcome, whatever it is: the clients
        waiting on it (Join, Sync, Commit) are answered in every case."""
        try:
            await pending
        except Exception as err:
            outcome: PymqError | None = append_error(err)
        else:
            outcome = None
        try:
            self._apply(append.complete(outcome, now_ms()))
        except Exception:
            background.report("group-append")


def append_error(err: Exception) -> PymqError:
    """What the clients waiting on a failed append of group records are told: a named error maps
    as Kafka maps it; anything else is a bug below the append, reported and answered
    UNKNOWN_SERVER_ERROR (Join, Sync and Commit are answered in every case)."""
    if isinstance(err, PymqError):
        return coordinator_error(err)
    background.report("group-append")
    return UnknownServerError(f"storing group state failed: {type(err).__name__}: {err}")


def coordinator_error(err: PymqError) -> PymqError:
    """What a failed append of coordinator records tells the client (Kafka's mapping): the
    partition moved -> NOT_COORDINATOR (find it again); anything else that may pass ->
    COORDINATOR_NOT_AVAILABLE (retry); the rest as it is."""
    if isinstance(err, (NotLeaderError, FencedLeaderEpochError, UnknownTopicOrPartitionError)):
        return NotCoordinatorError(f"not the coordinator any more: {err}")
    if err.retriable:
        return CoordinatorNotAvailableError(f"cannot store group state: {err}")
    return err


def encode_records(records: list[tuple[RecordKey, RecordValue]]) -> bytearray:
    """One record batch of coordinator records (tombstones have a null value)."""
    keys = [encode_key(key) for key, _ in records]
    values = [encode_value(value) for _, value in records]
    return record.encode_batch(batch_body.make_body(values, keys, timestamps_ms=now_ms()))


def read_records(partition_log: UnifiedLog) -> Iterator[tuple[RecordKey, RecordValue]]:
    """Every record of a partition of `__consumer_offsets` up to its high watermark, decoded."""
    offset, end = partition_log.log_start_offset, partition_log.high_watermark
    while offset < end:
        chunk = partition_log.read(offset, READ_CHUNK_BYTES)
        try:
            data = chunk.read_bytes()
        finally:
            chunk.close()
        start = offset
        for pos, header in record.iter_batches(data):
            if header.next_offset <= offset:
                continue
            body = record.decode_body(data, header, pos)
            for key, value in zip(body.column("key").to_pylist(), body.column("value").to_pylist()):
                yield decode_record(key, value)
            offset = header.next_offset
        if offset == start:
            raise CorruptMessageError(f"{partition_log.topic}-{partition_log.partition}: no whole batch at offset {offset}")
