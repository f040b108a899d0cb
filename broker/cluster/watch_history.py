"""WatchHistory and LocalWatch: the embedded store's recent changes, and iterators over them.

The store appends each committed revision's events to one bounded history; every watch reads
that history through its own cursor (the next revision it needs) instead of being pushed events,
so a slow watcher costs no memory per watcher and can never silently miss an event: once the
revisions it needs are dropped it gets CompactedRevisionError, as a too-slow etcd watcher does.
"""
from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from broker.cluster.metadata_store import CompactedRevisionError, Watch, WatchEvent


class WatchHistory:
    """The events of the newest revisions, at most `max_events` of them, except that the newest
    revision is always kept whole (a txn is never half in the history)."""

    def __init__(self, revision: int, max_events: int) -> None:
        assert max_events >= 1, max_events
        self.max_events = max_events
        self.revision = revision
        self.compacted_revision = revision  # every revision up to this one is gone
        self._events: dict[int, tuple[WatchEvent, ...]] = {}
        self._event_count = 0

    def append(self, revision: int, events: Sequence[WatchEvent]) -> None:
        assert revision == self.revision + 1, (revision, self.revision)
        assert events and all(event.revision == revision for event in events)
        self._events[revision] = tuple(events)
        self._event_count += len(events)
        self.revision = revision
        while self._event_count > self.max_events and len(self._events) > 1:
            self.compacted_revision += 1
            self._event_count -= len(self._events.pop(self.compacted_revision))

    def events_at(self, revision: int) -> tuple[WatchEvent, ...] | None:
        """The events of `revision`, or None while it is not committed yet. Raises
        CompactedRevisionError once it has been dropped."""
        if revision <= self.compacted_revision:
            raise CompactedRevisionError(
                f"revision {revision} is compacted (history starts after {self.compacted_revision}): "
                "re-read the keys and watch from the revision after that read",
                self.compacted_revision,
            )
        return self._events.get(revision)


class LocalWatch(Watch):
    """A cursor over a WatchHistory, filtered to keys under `prefix`. The store calls `notify`
    after each commit; `cancel` (or the store closing) ends the iteration. Events are copies."""

    def __init__(self, history: WatchHistory, prefix: str, start_revision: int,
                 on_cancel: Callable[["LocalWatch"], None]) -> None:
        assert start_revision >= 1, start_revision
        self._history = history
        self._prefix = prefix
        self._next_revision = start_revision
        self._on_cancel = on_cancel
        self._ready: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._cancelled = False

    def notify(self) -> None:
        self._wakeup.set()

    def cancel(self) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._wakeup.set()
            self._on_cancel(self)

    async def __anext__(self) -> WatchEvent:
        while not self._cancelled:
            if self._ready:
                event = self._ready.popleft()
                return event if event.value is None else replace(event, value=copy.deepcopy(event.value))
            events = self._history.events_at(self._next_revision)
            if events is None:
                # No await between the check above and this wait: a commit cannot slip in unseen.
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._next_revision += 1
            self._ready.extend(event for event in events if event.key.startswith(self._prefix))
        raise StopAsyncIteration
