"""Purgatories: requests that wait for a partition's state to move (Kafka's DelayedOperation).

- `FetchPurgatory`: a fetch that found fewer than `min_bytes` parks one future under every
  partition it asked for; when a partition's high watermark moves (not on append: data above the
  high watermark is invisible to consumers) the future resolves and the fetch reads again.
- `ProducePurgatory`: a produce whose acknowledgement must wait (the flush policy demands an
  fsync first; later, acks=all waits for the ISR) parks under its partition with the offset it
  needs; `complete` resolves every waiter whose condition now holds, `fail` every waiter of a
  partition (its log directory went offline).

Waking is O(waiters of that partition). Loop-local: call from the event-loop thread only.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

TopicPartition = tuple[str, int]


class FetchPurgatory:
    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = defaultdict(set)

    async def wait(self, partitions: list[TopicPartition], timeout_s: float) -> None:
        """Return when any of `partitions` has new committed data, or after `timeout_s` seconds."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        for tp in partitions:
            self._waiters[tp].add(future)
        # A timer resolving the same future instead of asyncio.wait_for, whose wrapping costs two
        # more loop turns between the notify and the fetch reading again (every tailing fetch).
        timer = loop.call_later(timeout_s, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            for tp in partitions:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        """Wake every fetch waiting on `tp` (its high watermark moved)."""
        waiters = self._waiters.pop(tp, None)
        if waiters:
            for future in waiters:
                _resolve(future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ProducePurgatory:
    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, list[tuple[int, int, asyncio.Future[None]]]] = {}

    def __len__(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    async def wait(self, tp: TopicPartition, required_offset: int, acks: int, timeout_s: float) -> None:
        """Wait until `complete` finds offsets below `required_offset` acknowledged for `acks`.
        TimeoutError after `timeout_s`; the error `fail` names if the partition fails first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (required_offset, acks, future)
        self._waiters.setdefault(tp, []).append(entry)
        try:
            await asyncio.wait_for(future, timeout_s)
        finally:
            waiters = self._waiters.get(tp)
            if waiters is not None and entry in waiters:
                waiters.remove(entry)
                if not waiters:
                    del self._waiters[tp]

    def complete(self, tp: TopicPartition, satisfied: Callable[[int, int], bool]) -> None:
        """Resolve the waiters of `tp` for which `satisfied(required_offset, acks)` holds."""
        waiters = self._waiters.get(tp)
        if not waiters:
            return
        keep = []
        for entry in waiters:
            required_offset, acks, future = entry
            if future.done():
                continue
            if satisfied(required_offset, acks):
                future.set_result(None)
            else:
                keep.append(entry)
        if keep:
            self._waiters[tp] = keep
        else:
            del self._waiters[tp]

    def fail(self, tp: TopicPartition, err: BaseException) -> None:
        for _, _, future in self._waiters.pop(tp, []):
            if not future.done():
                future.set_exception(err)

    def partitions(self) -> list[TopicPartition]:
        return list(self._waiters)
