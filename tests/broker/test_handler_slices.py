"""answer_in_slices (broker/handlers/slices.py): few entries at once, many a slice at a time with
the event loop free between slices."""
from __future__ import annotations

import asyncio
import inspect

from broker.handlers.slices import SLICE_ENTRIES, answer_in_slices


def test_few_entries_are_answered_at_once() -> None:
    assert answer_in_slices(list(range(SLICE_ENTRIES)), lambda e: e * 2, sum) == sum(range(SLICE_ENTRIES)) * 2


def test_many_entries_let_other_tasks_run_between_slices() -> None:
    """Another task that only counts loop turns runs once per slice boundary at least, and the
    answers keep the entries' order."""
    entries = list(range(SLICE_ENTRIES * 5 + 1))

    async def main() -> tuple[list[int], int]:
        turns = 0
        stop = asyncio.Event()

        async def other() -> None:
            nonlocal turns
            while not stop.is_set():
                turns += 1
                await asyncio.sleep(0)  # a loop turn, not a wait: counts the turns the slices leave to others

        task = asyncio.get_running_loop().create_task(other())
        await asyncio.sleep(0)  # a loop turn: the other task starts
        pending = answer_in_slices(entries, lambda e: -e, list)
        assert inspect.isawaitable(pending)
        answers = await pending
        stop.set()
        await task
        return answers, turns

    answers, turns = asyncio.run(main())
    assert answers == [-e for e in entries]
    assert turns >= 5


def test_an_awaitable_response_is_awaited() -> None:
    async def later(answers: list[int]) -> int:
        await asyncio.sleep(0)  # a loop turn: a response that really suspends
        return len(answers)

    assert asyncio.run(answer_in_slices(list(range(SLICE_ENTRIES + 1)), abs, later)) == SLICE_ENTRIES + 1
