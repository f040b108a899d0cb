"""DelayedOperationPurgatory: each parked operation answers exactly once (condition, deadline or
error), never after it is cancelled, and leaves nothing behind for the cyclic GC. ProducePurgatory:
a produce is parked when `watch` is called, not when its future is awaited."""
from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from broker.purgatory import DelayedOperation, DelayedOperationPurgatory, ProducePurgatory
from tests.waiting import wait_until_async


class Counter(DelayedOperation):
    """Completes once `ready` is set; at its deadline answers "expired"."""

    def __init__(self, keys: list[Any], ready: bool = False, broken: bool = False) -> None:
        super().__init__(keys)
        self.ready = ready
        self.broken = broken
        self.attempts = 0
        self.answers: list[tuple[Any, BaseException | None]] = []
        self.on_complete = lambda answer, error: self.answers.append((answer, error))

    def try_complete(self) -> bool:
        self.attempts += 1
        if self.broken:
            raise RuntimeError("bug in try_complete")
        if self.ready:
            self.complete("ready")
            return True
        return False

    def on_expiration(self) -> None:
        self.complete("expired")


async def turn() -> None:
    """Let callbacks scheduled with call_soon run: two loop turns, not a wait on time (one thread,
    one loop: what call_soon scheduled runs within them)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_notify_completes_on_the_next_loop_turn_and_stops_watching() -> None:
    async def main() -> None:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0), ("t", 1)])
        purgatory.watch(op, 10)
        assert len(purgatory) == 1
        purgatory.notify(("t", 0))
        await turn()
        assert op.answers == [] and op.attempts == 1 and not op.done  # condition not met: keeps watching
        op.ready = True
        purgatory.notify(("t", 1))
        assert op.answers == []  # not synchronously: after the request that moved the state
        await turn()
        assert op.answers == [("ready", None)]
        assert len(purgatory) == 0
        purgatory.notify(("t", 0))  # nobody watches any more
        await turn()
        assert op.answers == [("ready", None)] and op.attempts == 2

    asyncio.run(main())


def test_several_notifies_in_one_turn_make_one_attempt() -> None:
    async def main() -> None:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0)])
        purgatory.watch(op, 10)
        for _ in range(5):
            purgatory.notify(("t", 0))
        await turn()
        assert op.attempts == 1

    asyncio.run(main())


def test_deadline_answers_with_what_there_is() -> None:
    async def main() -> None:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0)])
        loop = asyncio.get_running_loop()
        started = loop.time()
        purgatory.watch(op, 0.05)
        await wait_until_async(lambda: op.done, 10, "the operation expires")
        assert op.answers == [("expired", None)]
        assert loop.time() - started >= 0.04
        assert len(purgatory) == 0

    asyncio.run(main())


def test_cancelled_operation_never_answers() -> None:
    async def main() -> None:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0)])
        purgatory.watch(op, 0.02)
        op.cancel()
        op.ready = True
        purgatory.notify(("t", 0))
        # What must not happen cannot be waited for: the notify's turn and the 20 ms deadline pass.
        await asyncio.sleep(0.05)
        assert op.answers == [] and op.attempts == 0
        assert len(purgatory) == 0

    asyncio.run(main())


def test_a_bug_in_try_complete_answers_with_the_error() -> None:
    async def main() -> None:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0)], broken=True)
        purgatory.watch(op, 10)
        purgatory.notify(("t", 0))
        await turn()
        assert len(op.answers) == 1
        answer, error = op.answers[0]
        assert answer is None and isinstance(error, RuntimeError)
        assert len(purgatory) == 0

    asyncio.run(main())


def test_complete_answers_once() -> None:
    op = Counter([("t", 0)])
    op.complete("first")
    op.complete("second")
    op.cancel()
    assert op.answers == [("first", None)]


@pytest.mark.parametrize("ending", ["notify", "expire", "cancel"])
def test_finished_operation_is_freed_by_reference_counting(ending: str) -> None:
    """Every fetch that parks becomes one of these: left in reference cycles, thousands a second
    made the cyclic GC pause the broker for tens of milliseconds."""

    async def main() -> weakref.ref[Counter]:
        purgatory = DelayedOperationPurgatory()
        op = Counter([("t", 0)])
        # A requester's callback that refers back to the operation, as the server's does.
        answers: list[Any] = []
        op.on_complete = lambda answer, error, op=op: answers.append((op.keys, answer))
        purgatory.watch(op, 0.01 if ending == "expire" else 10)
        if ending == "notify":
            op.ready = True
            purgatory.notify(("t", 0))
            await turn()
        elif ending == "expire":
            await wait_until_async(lambda: op.done, 10, "the operation expires")
        else:
            op.cancel()
        assert op.done
        ref = weakref.ref(op)
        del op
        return ref

    gc.disable()
    try:
        ref = asyncio.run(main())
        assert ref() is None
    finally:
        gc.enable()


def test_a_produce_completed_before_its_future_is_awaited_is_answered() -> None:
    """The handler awaits a request's partitions one after another: a partition's `complete`
    may come before its future is awaited, and must not be lost."""
    async def main() -> None:
        purgatory = ProducePurgatory()
        first = purgatory.watch(("t", 0), 10, -1, 5)
        second = purgatory.watch(("t", 1), 10, -1, 5)
        purgatory.complete(("t", 1), lambda offset, acks: offset <= 10)
        purgatory.complete(("t", 0), lambda offset, acks: offset <= 9)  # not yet
        assert not first.done()
        purgatory.complete(("t", 0), lambda offset, acks: offset <= 10)
        assert await asyncio.wait_for(first, 1) is None and await asyncio.wait_for(second, 1) is None
        await turn()
        assert len(purgatory) == 0

    asyncio.run(main())


def test_a_produce_times_out_from_when_it_was_parked_and_a_cancelled_one_is_unparked() -> None:
    async def main() -> None:
        purgatory = ProducePurgatory()
        timed = purgatory.watch(("t", 0), 10, -1, 0.01)
        cancelled = purgatory.watch(("t", 0), 10, -1, 5)
        failed = purgatory.watch(("t", 1), 10, -1, 5)  # never awaited: its requester went away
        with pytest.raises(TimeoutError):
            await timed
        cancelled.cancel()
        purgatory.fail(("t", 1), RuntimeError("log directory offline"))
        await turn()
        assert len(purgatory) == 0 and purgatory.partitions() == []
        assert isinstance(failed.exception(), RuntimeError)

    asyncio.run(main())
