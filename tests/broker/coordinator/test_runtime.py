"""The coordinator runtime (broker/coordinator/runtime.py) with a toy state machine, a register
of key -> value per partition, on the real log, log writer and replica manager: partitions are
loaded by replaying their records when this broker leads them and dropped when it stops; a
reply waits until the records are acknowledged (acks=all), a failed append leaves the state as it
was, timers fire at the state machine's deadlines, and a replay overtaken by a leadership change
feeds the state machine nothing more."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.partition import LeaderAndIsr
from broker.config import LogConfig
from broker.coordinator.results import Append, Result
from broker.coordinator.runtime import CoordinatorRuntime
from broker.executors import BoundedExecutor
from broker.log import LogManager, TopicLogSpec, UnifiedLog
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperationPurgatory
from broker.replica_manager import ReplicaManager
from segment_format import batch_body, record
from common.errors import (
    CoordinatorLoadInProgressError,
    MessageTooLargeError,
    NotCoordinatorError,
    PymqError,
)

TOPIC = "__toy_state"
MAX_MESSAGE_BYTES = 4096
LED = LeaderAndIsr(0, 0, (0,), (0,))


@dataclass(frozen=True)
class Answer:
    """The toy's reply (a real coordinator replies with its API's response message)."""

    value: str | None = None
    error: PymqError | None = None


@dataclass
class Register:
    """Toy coordinator: key -> value per partition of TOPIC, alarms that fire at a time, and
    requests parked on a partition until it is unloaded (as a JoinGroup waits for its rebalance)."""

    loaded: dict[int, dict[str, str]] = field(default_factory=dict)
    loading: dict[int, dict[str, str]] = field(default_factory=dict)
    alarms: list[tuple[int, Any]] = field(default_factory=list)
    parked: dict[int, list[Any]] = field(default_factory=dict)
    replayed: int = 0
    history: list[tuple[int, str, str | None, int]] = field(default_factory=list)  # replays and markers, in order
    deadline_checks: int = 0  # how often the runtime asked for the next deadline (its timer rounds)

    # -- StateMachine ------------------------------------------------------------------------------

    def begin_load(self, partition: int) -> None:
        self.loading[partition] = {}

    def replay(self, partition: int, key: str, value: str | None, producer_id: int) -> None:
        self.replayed += 1
        self.history.append((partition, key, value, producer_id))
        state = self.loading[partition]
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value

    def replay_marker(self, partition: int, producer_id: int, committed: bool) -> None:
        self.history.append((partition, "COMMIT" if committed else "ABORT", None, producer_id))

    def finish_load(self, partition: int, now_ms: int) -> None:
        self.loaded[partition] = self.loading.pop(partition)

    def unload(self, partition: int) -> Result:
        self.loading.pop(partition, None)
        self.loaded.pop(partition, None)
        moved = NotCoordinatorError(f"partition {partition} moved")
        return Result([(token, Answer(error=moved)) for token in self.parked.pop(partition, [])])

    def next_deadline(self) -> int | None:
        self.deadline_checks += 1
        return min((at for at, _ in self.alarms), default=None)

    def tick(self, now_ms: int) -> Result:
        due = [token for at, token in self.alarms if at <= now_ms]
        self.alarms = [(at, token) for at, token in self.alarms if at > now_ms]
        return Result([(token, Answer(f"rang at {now_ms}")) for token in due])

    # -- requests ----------------------------------------------------------------------------------

    def get(self, partition: int, key: str) -> Answer:
        try:
            return Answer(self._state(partition).get(key))
        except PymqError as err:
            return Answer(error=err)

    def put(self, partition: int, key: str, value: str, token: Any, producer: tuple[int, int] | None = None) -> Result:
        """Stored first (as `producer`'s transactional batch if given); the register changes
        (and the client hears) only once it is."""
        try:
            state = self._state(partition)
        except PymqError as err:
            return Result.reply(token, Answer(error=err))

        def complete(err: PymqError | None, now_ms: int) -> Result:
            if err is None:
                state[key] = value
            return Result.reply(token, Answer(value if err is None else None, err))

        return Result(appends=[Append(partition, [(key, value)], complete, producer)])

    def park(self, partition: int, token: Any) -> Result:
        """Answered only when the partition is unloaded."""
        self.parked.setdefault(partition, []).append(token)
        return Result()

    def alarm(self, at_ms: int, token: Any) -> Result:
        self.alarms.append((at_ms, token))
        return Result()

    def _state(self, partition: int) -> dict[str, str]:
        if partition in self.loading:
            raise CoordinatorLoadInProgressError(f"partition {partition} is loading")
        if partition not in self.loaded:
            raise NotCoordinatorError(f"partition {partition} is not led here")
        return self.loaded[partition]


@dataclass
class TextSerde:
    """UTF-8 keys and values; `gate` runs before each record is decoded (a test holds a replay there)."""

    gate: Callable[[], None] = lambda: None

    @staticmethod
    def serialize(key: str, value: str | None) -> tuple[bytes, bytes | None]:
        return key.encode(), None if value is None else value.encode()

    def deserialize(self, key: bytes | None, value: bytes | None) -> tuple[str, str | None]:
        self.gate()
        assert key is not None
        return key.decode(), None if value is None else value.decode()


@dataclass
class Clock:
    now_ms: int = 1_000

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Harness:
    replicas: ReplicaManager
    runtime: CoordinatorRuntime[str, str | None]
    register: Register
    serde: TextSerde
    clock: Clock
    spec: TopicLogSpec

    def put(self, partition: int, key: str, value: str,
            producer: tuple[int, int] | None = None) -> Answer | Awaitable[Answer]:
        return self.runtime.call(  # type: ignore[return-value]
            lambda token, now: self.register.put(partition, key, value, token, producer))

    async def become(self, partition: int, state: LeaderAndIsr) -> None:
        await self.replicas.become(TOPIC, partition, self.spec, state)

    def log_end(self, partition: int) -> int:
        return self.replicas.partition(TOPIC, partition).log.log_end_offset


@asynccontextmanager
async def harness(tmp_path: Path, isr: tuple[int, ...] = (0,)) -> AsyncIterator[Harness]:
    """TOPIC's partitions 0 and 1 led here (ISR `isr`), with a started runtime on them; replays
    run one at a time (one thread)."""
    logs = LogManager(tmp_path / "data")
    writer = LogWriter(offload_bytes=0, max_queued_bytes=1 << 20)
    replicas = ReplicaManager(0, logs, writer, DelayedOperationPurgatory())
    register, serde, clock = Register(), TextSerde(), Clock()
    pool = BoundedExecutor("toy-load", 1, 100)
    runtime = CoordinatorRuntime("toy", TOPIC, register, serde, replicas, pool, clock=clock)
    spec = TopicLogSpec(None, LogConfig(max_message_bytes=MAX_MESSAGE_BYTES), 2)
    led = LeaderAndIsr(0, 0, (0, 1), isr)
    await replicas.create_partitions(TOPIC, spec, [0, 1], {(TOPIC, 0): led, (TOPIC, 1): led})
    await runtime.start()
    try:
        yield Harness(replicas, runtime, register, serde, clock, spec)
    finally:
        await runtime.stop()
        await writer.close()
        pool.shutdown()
        logs.close()


async def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 10) -> None:
    """Poll `condition` on the loop (the runtime runs on it) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.01)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_partition_is_replayed_when_led_and_dropped_when_not(tmp_path: Path) -> None:
    """Values put on partition 0 are gone from the state machine when another broker leads it
    (NOT_COORDINATOR), and are back, replayed from the log, the latest per key, when this
    broker leads it again; partition 1 is untouched throughout."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            for key, value in [("a", "1"), ("b", "2"), ("a", "3")]:
                assert (await h.put(0, key, value)).value == value
            assert (await h.put(1, "c", "4")).value == "4"
            await h.become(0, LeaderAndIsr(1, 1, (0, 1), (1,)))
            assert isinstance(h.register.get(0, "a").error, NotCoordinatorError)
            await h.become(0, LeaderAndIsr(0, 2, (0, 1), (0,)))
            await h.runtime.loaded()
            assert h.register.loaded[0] == {"a": "3", "b": "2"}
            assert h.register.replayed == 3
            assert h.register.get(1, "c").value == "4"

    run(scenario)


def test_a_reply_waits_until_the_records_are_acknowledged(tmp_path: Path) -> None:
    """acks=all: with a follower in the ISR the record is in the leader's log but not committed,
    so the client has no answer and the register no new value; once the follower leaves the ISR
    the high watermark passes the record, and both come."""
    async def scenario() -> None:
        async with harness(tmp_path, isr=(0, 1)) as h:
            pending = h.put(0, "k", "v")
            assert isinstance(pending, asyncio.Future)
            await eventually(lambda: h.log_end(0) == 1, "the record is in the leader's log")
            assert not pending.done() and h.register.get(0, "k").value is None
            await h.become(0, LeaderAndIsr(0, 0, (0, 1), (0,)))  # the follower leaves the ISR
            assert (await asyncio.wait_for(pending, 10)).value == "v"
            assert h.register.get(0, "k").value == "v"

    run(scenario)


def test_a_failed_append_leaves_the_state_as_it_was(tmp_path: Path) -> None:
    """A value too large for the topic's max.message.bytes is refused by the log: the client is
    told why, the register keeps the value stored before, and the log holds only that one."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.put(0, "k", "small")).value == "small"
            answer = h.put(0, "k", "x" * (2 * MAX_MESSAGE_BYTES))
            answer = await answer if isinstance(answer, Awaitable) else answer
            assert isinstance(answer.error, MessageTooLargeError)
            assert h.register.get(0, "k").value == "small"
            assert h.log_end(0) == 1

    run(scenario)


def test_timers_fire_at_the_state_machines_deadline(tmp_path: Path) -> None:
    """An alarm for 5 s from now does not ring while the clock stands still; it rings once the
    clock passes it, answered from the Result of `tick`."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            rung = h.runtime.call(lambda token, now: h.register.alarm(now + 5_000, token))
            assert isinstance(rung, asyncio.Future)
            h.clock.now_ms += 4_999
            rounds = h.register.deadline_checks
            await eventually(lambda: h.register.deadline_checks >= rounds + 3, "three timer rounds")
            assert not rung.done()
            h.clock.now_ms += 1
            assert (await asyncio.wait_for(rung, 10)).value == "rang at 6000"
            assert h.register.alarms == []

    run(scenario)


def test_a_replay_overtaken_by_a_leadership_change_feeds_nothing_more(tmp_path: Path) -> None:
    """Partition 0 holds three records. Its replay is held while decoding the first record as
    leadership moves away and comes back: the stale replay stops before it feeds the state
    machine, and the new load alone fills the state (three records replayed, not six), so a
    stale replay never mixes into a newer load."""
    held, release = threading.Event(), threading.Event()

    def gate() -> None:
        held.set()
        release.wait(10)

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            for key in "abc":
                await h.put(0, key, key.upper())
            await h.become(0, LeaderAndIsr(1, 1, (0, 1), (1,)))
            h.register.replayed, h.serde.gate = 0, gate
            await h.become(0, LeaderAndIsr(0, 2, (0, 1), (0,)))
            await eventually(held.is_set, "the replay reached its first record")
            h.serde.gate = lambda: None
            await h.become(0, LeaderAndIsr(1, 3, (0, 1), (1,)))  # leadership moves mid-replay ...
            await h.become(0, LeaderAndIsr(0, 4, (0, 1), (0,)))  # ... and comes back: a new load, queued
            release.set()
            await h.runtime.loaded()
            assert h.register.loaded[0] == {"a": "A", "b": "B", "c": "C"}
            assert h.register.replayed == 3

    run(scenario)


def test_stop_answers_parked_requests_not_coordinator(tmp_path: Path) -> None:
    """A request still parked when the runtime stops (an alarm far ahead) is told
    NOT_COORDINATOR, so that its client looks for the coordinator again."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            parked = h.runtime.call(lambda token, now: h.register.alarm(now + 3_600_000, token))
            assert isinstance(parked, asyncio.Future)
        with pytest.raises(NotCoordinatorError, match="toy coordinator is shutting down"):
            await parked

    run(scenario)


def test_a_new_leader_replays_its_whole_log_not_only_to_its_high_watermark(tmp_path: Path) -> None:
    """A follower learns the high watermark one fetch after the leader moved it, so when it takes
    over, records the old leader had acknowledged sit past its high watermark (which moves only
    once its own followers fetch). Those records are the partition's history from now on (as its
    leader, this broker's log is what every replica ends up with): the load replays the whole log,
    as Kafka's CoordinatorLoaderImpl does (to the log end offset). Replayed only to the high
    watermark, the new coordinator lost the group's last generation: its member was told
    UNKNOWN_MEMBER_ID ("group does not exist") and its last commits were gone."""
    async def scenario() -> None:
        async with harness(tmp_path, isr=(0, 1)) as h:
            pending = h.put(0, "group", "generation 1")  # in the log, not past the high watermark
            await eventually(lambda: h.log_end(0) == 1, "the record is in the log")
            await h.become(0, LeaderAndIsr(1, 1, (0, 1), (0, 1)))  # a follower for a while ...
            assert isinstance((await asyncio.wait_for(pending, 10)).error, NotCoordinatorError)
            await h.become(0, LeaderAndIsr(0, 2, (0, 1), (0, 1)))  # ... and the leader again, follower 1 not fetched yet
            await h.runtime.loaded()
            assert h.replicas.partition(TOPIC, 0).log.high_watermark == 0
            assert h.register.loaded[0] == {"group": "generation 1"}

    run(scenario)


def test_a_partition_led_again_under_a_newer_epoch_is_unloaded_before_it_is_replayed(tmp_path: Path) -> None:
    """The metadata listener hands the broker a partition's latest state: one that led it under
    epoch 0 may next see itself leading under epoch 2 (epoch 1, another broker's, came and went
    in between). The load replays the log and replaces the state machine's state, so what was
    parked on the old state (a JoinGroup waiting for its rebalance) is first answered
    NOT_COORDINATOR by the unload (its client finds the coordinator again and rejoins), rather
    than waiting on state nobody holds any more until its client times out (max.poll.interval.ms:
    a group consumer reading nothing for minutes, with no error)."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.put(0, "k", "v")).value == "v"
            parked = h.runtime.call(lambda token, now: h.register.park(0, token))
            assert isinstance(parked, asyncio.Future)
            await h.become(0, LeaderAndIsr(0, 2, (0, 1), (0,)))
            assert isinstance((await asyncio.wait_for(parked, 10)).error, NotCoordinatorError)
            await h.runtime.loaded()
            assert h.register.loaded[0] == {"k": "v"}

    run(scenario)


COMMIT_KEY, ABORT_KEY = b"\x00\x00\x00\x01", b"\x00\x00\x00\x00"  # Kafka's EndTransactionMarker keys
# The leader's log takes a transactional batch from the broker itself, and writes markers, once
# the producer-state branch (transactional log layer) is merged.


def stored_batch(log: UnifiedLog, key: bytes, value: bytes | None, attributes: int = 0, producer_id: int = -1) -> None:
    """A batch as a leader wrote it, appended at the log end (trusted, as a follower appends)."""
    body = batch_body.make_body([value], [key], timestamps_ms=1_000)
    log.append_as_follower(record.encode_batch(body, base_offset=log.log_end_offset, attributes=attributes,
                                               producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1))


def test_replay_tells_transactional_records_and_markers_apart(tmp_path: Path) -> None:
    """A record of a transactional batch replays with its producer id, a plain one with -1, and a
    control batch is a marker (COMMIT or ABORT of its producer), never a record of the state machine."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.put(0, "plain", "1")).value == "1"
            log = h.replicas.partition(TOPIC, 0).log
            stored_batch(log, b"txn", b"2", record.TRANSACTIONAL_BIT, producer_id=5)
            stored_batch(log, COMMIT_KEY, b"\x00\x00\x00\x00\x00\x00", record.CONTROL_BIT | record.TRANSACTIONAL_BIT, 5)
            stored_batch(log, ABORT_KEY, b"\x00\x00\x00\x00\x00\x00", record.CONTROL_BIT | record.TRANSACTIONAL_BIT, 6)
            h.register.history.clear()
            await h.become(0, LeaderAndIsr(0, 1, (0,), (0,)))
            await h.runtime.loaded()
            assert h.register.history == [(0, "plain", "1", -1), (0, "txn", "2", 5), (0, "COMMIT", None, 5),
                                          (0, "ABORT", None, 6)]

    run(scenario)


def test_an_append_with_a_producer_is_that_producer_s_transactional_batch(tmp_path: Path) -> None:
    """The runtime writes it with the producer id and epoch, the TRANSACTIONAL bit and base
    sequence -1; a replay gives its records that producer id."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            assert (await h.put(0, "offset", "9", producer=(5, 2))).value == "9"
            chunk = h.replicas.partition(TOPIC, 0).log.read(0, 1 << 20, 1)
            try:
                header = record.read_header(chunk.read_bytes(), 0)
            finally:
                chunk.close()
            assert (header.is_transactional, header.is_control) == (True, False)
            assert (header.producer_id, header.producer_epoch, header.base_sequence) == (5, 2, -1)
            h.register.history.clear()
            await h.become(0, LeaderAndIsr(0, 1, (0,), (0,)))
            await h.runtime.loaded()
            assert h.register.history == [(0, "offset", "9", 5)]

    run(scenario)
