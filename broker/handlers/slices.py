"""Large answers in slices, so that one request does not keep the event loop from every other.

A request may hold up to `request.max.elements` entries (a Metadata request naming 100,000 topics,
or asking for every topic of a broker that has that many), and answering each entry is Python
work on the event loop. Answered in one go, such a request made every other client wait for it
(a second for 100,000 entries; tens of seconds for a million, before the cap). `answer_in_slices`
answers SLICE_ENTRIES entries at a time and lets the loop run between slices, so other requests
are served meanwhile; a request with few entries is answered at once, with no task or await.

Between slices the broker's state may change (a topic created, a group rebalanced): each entry's
answer is consistent in itself, as each partition's answer to a request always was.
"""
from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

E = TypeVar("E")  # a request entry
A = TypeVar("A")  # its answer
R = TypeVar("R")  # the response

SLICE_ENTRIES = 1_000


def answer_in_slices(entries: Sequence[E], answer: Callable[[E], A],
                     respond: Callable[[list[A]], R | Awaitable[R]]) -> R | Awaitable[R]:
    """`respond([answer(e) for e in entries])`: at once for up to SLICE_ENTRIES entries, else an
    awaitable that answers them a slice at a time, yielding to the loop between slices. `respond`
    may itself return an awaitable (answers that wait for a remote read), which is awaited."""
    if len(entries) <= SLICE_ENTRIES:
        return respond([answer(entry) for entry in entries])
    return _sliced(entries, answer, respond)


async def _sliced(entries: Sequence[E], answer: Callable[[E], A],
                  respond: Callable[[list[A]], R | Awaitable[R]]) -> R:
    answers: list[A] = []
    for start in range(0, len(entries), SLICE_ENTRIES):
        if start:
            await asyncio.sleep(0)
        answers.extend(answer(entry) for entry in entries[start:start + SLICE_ENTRIES])
    response = respond(answers)
    if inspect.isawaitable(response):
        return await response
    return response  # type: ignore[return-value]
