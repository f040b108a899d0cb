"""Sequential read-ahead over a remote `.log`: the next window is fetched while the caller works.

A reader that scans a remote segment from start to end (a Spark task reading the tier directly)
otherwise alternates: wait for a ranged GET, decode it, hand the rows on, wait again. With
`ReadAhead` as its SegmentReader's source, the GET of window i + 1 runs on a background thread
while window i is decoded, so the task waits for the store once per segment (its first window),
and not even then when the window was primed before the segment was reached (`prime`).

SegmentReader reads sequentially: each read starts where the previous one ended, and with its
window fixed (min = max read bytes) asks for `window` bytes or, for a batch larger than that, the
whole batch. A read that starts where the prefetched window starts takes it (plus a direct read
of any bytes it wants beyond it); any other read is served directly and restarts the read-ahead
from its end. Memory: at most one window in flight or waiting per ReadAhead.

Errors of a background fetch (RemoteStorageError, CorruptMessageError, ...) are raised by the
read that takes its window, exactly as a direct read would raise them.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future

# fetch(position, size) -> exactly `size` bytes of the object from byte `position`
Fetch = Callable[[int, int], bytes]


class ReadAhead:
    """A pread (`(size, position) -> bytes`, SegmentReader's source) over an object of `size`
    bytes, fetching `window` bytes ahead on `executor` (shared by the caller's ReadAheads)."""

    def __init__(self, fetch: Fetch, size: int, window: int, executor: Executor) -> None:
        if window <= 0:
            raise ValueError(f"read-ahead window must be positive, got {window}")
        self._fetch, self.size, self.window, self._executor = fetch, size, window, executor
        self._ahead: tuple[int, Future[bytes]] | None = None  # (position, its window's bytes)
        self.fetches = 0  # fetches issued (direct or ahead): what a test or a benchmark counts

    def prime(self, position: int) -> None:
        """Start fetching the window at `position` now (a reader will start there)."""
        self._start(position)

    def __call__(self, size: int, position: int) -> bytes:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == position and size > 0:
            data = ahead[1].result()
            if len(data) >= size:
                data = data[:size] if len(data) > size else data
            else:  # a batch larger than the window: the rest directly
                data += self._get(position + len(data), size - len(data))
        else:
            if ahead is not None:
                ahead[1].cancel()
            data = self._get(position, size)
        self._start(position + size)
        return data

    def close(self) -> None:
        """Drop the window ahead (a fetch already running finishes and is discarded)."""
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def _start(self, position: int) -> None:
        if self._ahead is not None or position >= self.size:
            return
        size = min(self.window, self.size - position)
        self.fetches += 1
        self._ahead = (position, self._executor.submit(self._fetch, position, size))

    def _get(self, position: int, size: int) -> bytes:
        if not size:
            return b""
        self.fetches += 1
        return self._fetch(position, size)
