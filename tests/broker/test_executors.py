"""BoundedExecutor (broker/executors.py) and ByteBudget (broker/backpressure.py): bounded queues
that push back instead of growing."""
from __future__ import annotations

import asyncio
import threading

import pytest

from broker.backpressure import ByteBudget
from common.errors import WorkQueueFullError
from broker.executors import BackgroundExecutors, BoundedExecutor
from tests.waiting import wait_until_async


@pytest.fixture
def gate():
    """A task body that blocks its pool thread until the test opens the gate."""
    opened = threading.Event()
    yield opened
    opened.set()


def test_submit_past_capacity_raises_a_named_retriable_error(gate):
    executor = BoundedExecutor("test", threads=1, max_queued=2)
    futures = [executor.submit(gate.wait, 10) for _ in range(3)]
    assert executor.depth == 3 == executor.capacity
    with pytest.raises(WorkQueueFullError) as refused:
        executor.submit(gate.wait, 10)
    assert refused.value.retriable and executor.rejected == 1
    gate.set()
    assert [f.result(timeout=10) for f in futures] == [True] * 3
    executor.shutdown()
    assert executor.depth == 0 and executor.completed == 3


def test_run_waits_for_room_without_blocking_the_loop(gate):
    """run() past capacity waits on the loop (other callbacks still run) and proceeds once a
    task finishes; the queue never holds more than `capacity`."""
    executor = BoundedExecutor("test", threads=1, max_queued=0)

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(executor.run(gate.wait, 10))
        await wait_until_async(lambda: executor.depth == 1, 10, "the first task holds the one thread")
        second = asyncio.ensure_future(executor.run(lambda: 2))
        ticks = 0
        for _ in range(10):  # the loop keeps running while `second` waits for room: ticks, not a wait
            await asyncio.sleep(0.01)
            ticks += 1
        assert not second.done() and executor.depth == 1 and ticks == 10
        gate.set()
        return [await first, await second]

    assert asyncio.run(scenario()) == [True, 2]
    assert executor.rejected == 0 and executor.depth == 0
    executor.shutdown()


def test_run_propagates_the_task_error_and_frees_its_slot():
    executor = BoundedExecutor("test", threads=1, max_queued=0)

    async def scenario() -> None:
        with pytest.raises(ZeroDivisionError):
            await executor.run(lambda: 1 / 0)
        assert await executor.run(lambda: 3) == 3

    asyncio.run(scenario())
    assert executor.depth == 0
    executor.shutdown()


def test_background_executors_one_named_pool_per_kind():
    executors = BackgroundExecutors.create(threads=1, max_queued=5)
    names = [e.name for e in executors.all()]
    assert names == ["flush", "checkpoint", "retention", "logs", "metadata", "group-load", "replication", "large-reads"]
    assert all(e.capacity == 6 for e in executors.all())
    executors.shutdown()


def test_byte_budget_admits_then_wakes_waiters_once_under_the_limit():
    budget = ByteBudget("test", 100)
    budget.acquire(250)  # one holder larger than the whole limit is admitted when nothing else is held
    assert budget.exhausted and budget.peak_bytes == 250
    woken: list[str] = []
    budget.wake_when_available(lambda: woken.append("a"))
    budget.wake_when_available(lambda: woken.append("b"))
    budget.release(100)
    assert woken == []  # 150 still held
    budget.release(60)
    assert woken == ["a", "b"] and not budget.exhausted
    budget.release(90)
    assert woken == ["a", "b"] and budget.used_bytes == 0  # each waiter woken once


def test_byte_budget_refuses_a_zero_limit():
    with pytest.raises(ValueError):
        ByteBudget("test", 0)
