"""Fetch purgatory: long-polling fetches wait here until data arrives or their wait runs out.

A fetch that found fewer than `min_bytes` parks one future under every partition it asked for;
an append to any of them resolves the future and the fetch reads again. Waking is O(waiters of
that partition), and a woken fetch unregisters itself from all its partitions.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

TopicPartition = tuple[str, int]


class FetchPurgatory:
    """Loop-local: call from the event-loop thread only."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = defaultdict(set)

    async def wait(self, partitions: list[TopicPartition], timeout_s: float) -> None:
        """Return when any of `partitions` is appended to, or after `timeout_s` seconds."""
        if timeout_s <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in partitions:
            self._waiters[tp].add(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            for tp in partitions:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        """Wake every fetch waiting on `tp` (called after an append)."""
        waiters = self._waiters.pop(tp, None)
        if waiters:
            for future in waiters:
                if not future.done():
                    future.set_result(None)

