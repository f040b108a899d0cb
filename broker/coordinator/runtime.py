"""The coordinator runtime: hosts a pure coordinator state machine on the partitions of its
internal topic (Kafka's `CoordinatorRuntime`, org.apache.kafka.coordinator.common.runtime).

A coordinator is a state machine with no I/O, no clock and no event loop (`StateMachine` below):
the group coordinator over `__consumer_offsets`, the transaction coordinator over
`__transaction_state` next. The coordinator of a key is the leader of the key's partition of the
topic, so the runtime follows partition leadership and does all the I/O for its state machine:

- load: when this broker becomes the leader of a partition of the topic, `begin_load`, then
  every record up to the log end offset (not the high watermark: see `read_records`) goes to
  `replay` (on a worker pool: a big partition does not hold the loop), then `finish_load` on the
  loop. The state machine answers COORDINATOR_LOAD_IN_PROGRESS for the partition meanwhile. A
  partition whose records cannot be read stays loading (unavailable) rather than coordinated
  from a guessed state. A partition led anew is unloaded first (see `on_leadership_change`).
  Records of transactional batches replay with their producer id, and transaction markers
  (control batches) as `replay_marker`, in log order (`read_records`).
- unload: when it stops leading, `unload`; its Result answers the requests parked on the
  partition (NOT_COORDINATOR: the clients find the new coordinator, which replays). A replay the
  leadership change overtakes stops before its next record, so it never feeds a later load.
- appends: each `Append` of a Result is one record batch appended with acks=all (the state is
  as durable as any committed record), and only once the high watermark passed it (or the append
  failed) is `complete(error, now_ms)` called; the state machine changes its state there, so a
  failed append leaves it as it was, and the replies that waited are sent from that Result.
  An Append with a producer (id, epoch) is written as that producer's transactional batch.
- timers: `tick(now_ms)` whenever `next_deadline()` has passed (checked every `TICK_S`), and
  periodic duties (`every`, e.g. offset expiry) that return Results.
- requests: `call` hands the state machine a token (a future) that the Result answering the
  request resolves, at once or later (after an append, when a rebalance completes).

Loop-local: call from the event-loop thread only (`replay` alone runs on the pool, and touches
only the loading state of its partition).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from broker import background
from broker.cluster.partition import Partition
from broker.coordinator.results import NO_PRODUCER_ID, Append, Result
from broker.executors import BoundedExecutor
from broker.log import UnifiedLog
from broker.replica_manager import ReplicaManager
from common.errors import (
    CoordinatorNotAvailableError,
    CorruptMessageError,
    FencedLeaderEpochError,
    NotCoordinatorError,
    NotLeaderError,
    PymqError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from protocol.messages.base import Message
from segment_format import batch_body, control_batch, record
from segment_format.batch_body import now_ms

log = logging.getLogger("pymq.coordinator_runtime")

APPEND_TIMEOUT_MS = 5_000  # Kafka's offsets.commit.timeout.ms
TICK_S = 0.05  # timer resolution of the state machines' deadlines (sessions, rebalance timeouts)
READ_CHUNK_BYTES = 4 << 20
NO_SEQUENCE = -1  # the base_sequence of a batch the broker writes itself (Kafka's RecordBatch.NO_SEQUENCE)

K = TypeVar("K")
V = TypeVar("V")


class StateMachine(Protocol[K, V]):
    """What a coordinator implements to run on a `CoordinatorRuntime`. Every method is called
    on the loop except `replay` (see `CoordinatorRuntime`); none does I/O or reads a clock."""

    def begin_load(self, partition: int) -> None:
        """This broker now leads `partition`: its keys answer LOAD_IN_PROGRESS until `finish_load`."""

    def replay(self, partition: int, key: K, value: V, producer_id: int) -> None:
        """One stored record of the partition, in offset order (a None value is a tombstone);
        `producer_id` is the producer of its transactional batch, -1 for a plain batch."""

    def replay_marker(self, partition: int, producer_id: int, committed: bool) -> None:
        """A transaction marker (control batch) of the partition, in offset order with the records:
        the transactional records of `producer_id` replayed so far are committed or aborted."""

    def finish_load(self, partition: int, now_ms: int) -> Result | None:
        """Every record of the partition's log was replayed: serve the partition's keys (and carry
        out the Result, if any: work the replayed state left unfinished)."""

    def unload(self, partition: int) -> Result:
        """This broker no longer leads `partition`: drop its state, answer what waits on it."""

    def next_deadline(self) -> int | None:
        """The earliest time (ms) `tick` has something to do, or None."""

    def tick(self, now_ms: int) -> Result:
        """Whatever is due at `now_ms` (expired sessions, rebalance deadlines)."""


class RecordSerde(Protocol[K, V]):
    """The bytes of a coordinator's records in its internal topic (key and value columns)."""

    def serialize(self, key: K, value: V) -> tuple[bytes, bytes | None]:
        """(key bytes, value bytes or None for a tombstone)."""

    def deserialize(self, key: bytes | None, value: bytes | None) -> tuple[K, V]:
        """One stored record; CorruptMessageError for bytes this version did not write."""


class _Load:
    """One replay of a partition. `cancel` (on the loop) and each record's replay (on the
    pool) take the lock, so once `cancel` returns the replay feeds the state machine no more."""

    __slots__ = ("lock", "cancelled", "task")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True


class LoadCancelled(Exception):
    """The partition's leadership changed while its records were replayed."""


class CoordinatorRuntime(Generic[K, V]):
    """Runs `machine` on the partitions of `topic` this broker leads. Loop-local.

    `name` names the coordinator in logs and in the background error counts (`{name}-timers`,
    `{name}-append`); `load_pool` runs the replays; `clock` gives the time in ms (injectable);
    `on_effect` carries out the effects of the machine's Results."""

    def __init__(self, name: str, topic: str, machine: StateMachine[K, V], serde: RecordSerde[K, V],
                 replicas: ReplicaManager, load_pool: BoundedExecutor, clock: Callable[[], int] = now_ms,
                 append_timeout_ms: int = APPEND_TIMEOUT_MS, on_effect: Callable[[Any], None] | None = None) -> None:
        self.name = name
        self.topic = topic
        self.machine = machine
        self.serde = serde
        self.replicas = replicas
        self.clock = clock
        self._load_pool = load_pool
        self._append_timeout_ms = append_timeout_ms
        self.on_effect = on_effect  # carries out the state machine's Result.effects
        self._duties: list[tuple[str, float, Callable[[int], Result]]] = [(f"{name}-timers", TICK_S, self._due)]
        self._tasks: list[asyncio.Task[None]] = []
        self._appends: set[asyncio.Task[None]] = set()
        self._waiting: set[asyncio.Future[Message]] = set()  # requests parked until a Result answers them
        self._loads: dict[int, _Load] = {}  # replays in progress, by partition
        replicas.leadership_listeners.append(self.on_leadership_change)

    # -- lifecycle ---------------------------------------------------------------------------------

    def every(self, task: str, interval_s: float, step: Callable[[int], Result]) -> None:
        """A periodic duty of the state machine (e.g. offset expiry), run from `start` on."""
        self._duties.append((task, interval_s, step))

    async def start(self) -> None:
        """Wait for the replays begun so far (the partitions the replica manager loaded), then run
        the timers and periodic duties."""
        await self.loaded()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(background.every(task, interval_s, self._run(step)))
                       for task, interval_s, step in self._duties]

    def _run(self, step: Callable[[int], Result]) -> Callable[[], None]:
        """A duty's round: the step at the time now, its Result carried out."""
        return lambda: self.apply(step(self.clock()))

    async def stop(self) -> None:
        """Stop the timers, let the appends in flight finish (their requests are answered), then
        answer every request still parked (a JoinGroup waiting for its rebalance) NOT_COORDINATOR:
        its client finds the coordinator again instead of waiting on a broker that is stopping."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._appends, *self._load_tasks(), return_exceptions=True)
        for token in list(self._waiting):
            if not token.done():
                token.set_exception(NotCoordinatorError(f"the {self.name} coordinator is shutting down"))

    async def loaded(self) -> None:
        """Until the replays begun so far are done."""
        await asyncio.gather(*self._load_tasks(), return_exceptions=True)

    def _due(self, now: int) -> Result:
        """The state machine's deadlines that passed (sessions, rebalance timeouts), if any."""
        deadline = self.machine.next_deadline()
        return self.machine.tick(now) if deadline is not None and deadline <= now else Result()

    def _load_tasks(self) -> list[asyncio.Task[None]]:
        return [load.task for load in self._loads.values() if load.task is not None]

    # -- partition leadership ----------------------------------------------------------------------

    def on_leadership_change(self, led: list[Partition], unled: list[Partition]) -> None:
        """The replica manager's listener: load the topic's partitions this broker now leads,
        unload those it no longer leads. A partition led anew is unloaded first: this broker may
        have led it under an older epoch (the listener hands over the latest state, so leading
        it again under a newer one can come with no change in between), and the replay replaces
        the state machine's state, so what was parked on the old state is answered
        NOT_COORDINATOR rather than left waiting on state nobody holds."""
        for target in [*unled, *led]:
            if target.topic == self.topic:
                self._cancel_load(target.partition)
                self.apply(self.machine.unload(target.partition))
        for target in led:
            if target.topic == self.topic:
                self.machine.begin_load(target.partition)
                load = self._loads[target.partition] = _Load()
                load.task = asyncio.get_running_loop().create_task(self._load(target.partition, load))

    def _cancel_load(self, partition: int) -> None:
        load = self._loads.pop(partition, None)
        if load is not None:
            load.cancel()

    async def _load(self, partition: int, load: _Load) -> None:
        """Replay one partition (its load begun by `on_leadership_change`)."""
        try:
            try:
                partition_log = self.replicas.leader_log(self.topic, partition)
            except PymqError as err:
                log.info("not replaying %s-%d: %s", self.topic, partition, err)
                return
            started = self.clock()
            count = await self._load_pool.run(self._replay, partition, partition_log, load)
            if load.cancelled:
                return
            resumed = self.machine.finish_load(partition, self.clock())
            if resumed is not None:
                self.apply(resumed)
            if count:
                log.info("replayed %d records of %s-%d in %d ms", count, self.topic, partition, self.clock() - started)
        except LoadCancelled:
            return
        except PymqError as err:
            log.error("cannot replay %s-%d; its %s state stays unavailable: %s", self.topic, partition, self.name, err)
        except Exception:
            background.report(f"{self.name}-load")
        finally:
            if self._loads.get(partition) is load:
                del self._loads[partition]

    def _replay(self, partition: int, partition_log: UnifiedLog, load: _Load) -> int:
        """Worker thread: feed every record of the partition to the state machine."""
        count = 0
        for stored in read_records(partition_log, self.serde):
            with load.lock:
                if load.cancelled:
                    raise LoadCancelled(f"{self.topic}-{partition}")
                if isinstance(stored, Marker):
                    self.machine.replay_marker(partition, stored.producer_id, stored.committed)
                else:
                    self.machine.replay(partition, stored.key, stored.value, stored.producer_id)
            count += 1
        return count

    # -- requests and results ----------------------------------------------------------------------

    def call(self, step: Callable[[asyncio.Future[Message], int], Result]) -> Message | Awaitable[Message]:
        """Run a state machine step whose answer may come later: `step(token, now_ms)` returns a
        Result, and the reply to `token` in it or in a later Result answers the request."""
        token: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.apply(step(token, self.clock()))
        if token.done():
            return token.result()
        self._waiting.add(token)
        token.add_done_callback(self._waiting.discard)
        return token

    def apply(self, result: Result) -> None:
        """Send a Result's replies, and start its appends (in order: a partition's records keep
        the state machine's order)."""
        for token, response in result.replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(response)
        for append in result.appends:
            self._start_append(append)
        if result.effects:
            assert self.on_effect is not None, f"the {self.name} coordinator asked for effects and has no handler"
            for effect in result.effects:
                self.on_effect(effect)

    def _start_append(self, append: Append) -> None:
        try:
            pending = self.replicas.append(self.topic, append.partition, memoryview(self._encode(append)),
                                           acks=-1, timeout_ms=self._append_timeout_ms, coordinator=True)
        except Exception as err:
            self.apply(append.complete(append_error(err, self.name), self.clock()))
            return
        if not isinstance(pending, Awaitable):
            self.apply(append.complete(None, self.clock()))
            return
        task = asyncio.get_running_loop().create_task(self._finish_append(append, pending))
        self._appends.add(task)
        task.add_done_callback(self._appends.discard)

    async def _finish_append(self, append: Append, pending: Awaitable[Any]) -> None:
        """Complete the state machine's step with the append's outcome, whatever it is: the
        clients waiting on it are answered in every case."""
        try:
            await pending
        except Exception as err:
            outcome: PymqError | None = append_error(err, self.name)
        else:
            outcome = None
        try:
            self.apply(append.complete(outcome, self.clock()))
        except Exception:
            background.report(f"{self.name}-append")

    def _encode(self, append: Append) -> bytearray:
        """One record batch of the state machine's records (tombstones have a null value), stamped
        with the wall clock: the log checks record timestamps, whatever clock the runtime runs on.
        An append with a producer is a transactional batch of that producer id and epoch, as
        Kafka's coordinator writes a TxnOffsetCommit: base_sequence -1, for the coordinator, not
        the producer, writes it (the producer's sequences number its own batches only)."""
        keys, values = zip(*(self.serde.serialize(key, value) for key, value in append.records))
        body = batch_body.make_body(list(values), list(keys), timestamps_ms=now_ms())
        if append.producer is None:
            return record.encode_batch(body)
        producer_id, producer_epoch = append.producer
        return record.encode_batch(body, attributes=record.TRANSACTIONAL_BIT, producer_id=producer_id,
                                   producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE)


def append_error(err: Exception, name: str) -> PymqError:
    """What the clients waiting on a failed append of `name` coordinator records are told: a
    named error maps as Kafka maps it; anything else is a bug below the append, reported and
    answered UNKNOWN_SERVER_ERROR."""
    if isinstance(err, PymqError):
        return coordinator_error(err, name)
    background.report(f"{name}-append")
    return UnknownServerError(f"storing {name} state failed: {type(err).__name__}: {err}")


def coordinator_error(err: PymqError, name: str) -> PymqError:
    """What a failed append of coordinator records tells the client (Kafka's mapping): the
    partition moved -> NOT_COORDINATOR (find it again); anything else that may pass ->
    COORDINATOR_NOT_AVAILABLE (retry); the rest as it is."""
    if isinstance(err, (NotLeaderError, FencedLeaderEpochError, UnknownTopicOrPartitionError)):
        return NotCoordinatorError(f"not the coordinator any more: {err}")
    if err.retriable:
        return CoordinatorNotAvailableError(f"cannot store {name} state: {err}")
    return err


@dataclass(frozen=True, slots=True)
class StoredRecord(Generic[K, V]):
    """A coordinator record as replayed: `producer_id` of its transactional batch, else -1."""

    key: K
    value: V
    producer_id: int = NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class Marker:
    """A transaction's commit or abort marker (a control batch) as replayed."""

    producer_id: int
    committed: bool


def read_records(partition_log: UnifiedLog, serde: RecordSerde[K, V]) -> Iterator[StoredRecord[K, V] | Marker]:
    """Every record of a partition of an internal topic, decoded, and its transaction markers: to
    its log end offset, not its high watermark (Kafka's CoordinatorLoaderImpl too). A new leader
    learned the high watermark one fetch after its old leader moved it, and moves it only once its
    own followers fetch, so records the old leader acknowledged (a group's last generation, its
    last commits) may sit past it; as the leader's log, they are what every replica ends up with.

    A record of a transactional batch carries the batch's producer id; a control batch is never
    decoded as coordinator records: it is the `Marker` of its producer's transaction."""
    offset, end = partition_log.log_start_offset, partition_log.log_end_offset
    while offset < end:
        chunk = partition_log.read(offset, READ_CHUNK_BYTES, end)
        try:
            data = chunk.read_bytes()
        finally:
            chunk.close()
        start = offset
        for pos, header in record.iter_batches(data):
            if header.next_offset <= offset:
                continue
            body = record.decode_body(data, header, pos)
            if header.is_control:
                yield Marker(header.producer_id, control_batch.marker_of(body, pos).commit)
            else:
                producer_id = header.producer_id if header.is_transactional else NO_PRODUCER_ID
                for key, value in zip(body.column("key").to_pylist(), body.column("value").to_pylist()):
                    yield StoredRecord(*serde.deserialize(key, value), producer_id)
            offset = header.next_offset
        if offset == start:
            raise CorruptMessageError(f"{partition_log.topic}-{partition_log.partition}: no whole batch at offset {offset}")
