"""BoundedExecutor: a named thread pool with a bounded queue, one per kind of background work.

asyncio's default executor (`asyncio.to_thread`, `run_in_executor(None, ...)`) has an unbounded
queue shared by everything: a burst of one kind of work (10,000 partitions' flushes) queues
without limit and delays every other kind (a checkpoint, a group load) behind it. Each kind gets
its own pool instead (`BackgroundExecutors`), bounded at `threads + max_queued` tasks waiting or
running:

- `run(fn, *args)` (event loop): awaits `fn`'s result; while the pool is full it waits for room
  without blocking the loop (backpressure on the coroutine, not on the loop).
- `submit(fn, *args)` (any thread, never waits): a concurrent Future, or WorkQueueFullError when
  the pool is full (the caller drops optional work or answers a retriable error).

`depth` (tasks waiting or running), `rejected` and `completed` are read by broker/metrics.py.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from common.errors import WorkQueueFullError

if TYPE_CHECKING:
    from broker.config import BrokerConfig

T = TypeVar("T")


class BoundedExecutor:
    def __init__(self, name: str, threads: int, max_queued: int) -> None:
        if threads < 1 or max_queued < 0:
            raise ValueError(f"{name}: threads must be >= 1 and max_queued >= 0, not {threads}, {max_queued}")
        self.name = name
        self.capacity = threads + max_queued
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"pymq-{name}")
        self._lock = threading.Lock()
        self._depth = 0
        self._room: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # run() calls waiting
        self.rejected = self.completed = 0

    @property
    def depth(self) -> int:
        """Tasks queued or running now."""
        return self._depth

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue `fn(*args)`; WorkQueueFullError if `capacity` tasks are queued or running."""
        future = self._try_submit(fn, args)
        if future is None:
            with self._lock:
                self.rejected += 1
            raise WorkQueueFullError(f"{self.name}: {self.capacity} tasks queued or running")
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a pool thread; waits (on the loop, not blocking it) while the pool is full."""
        while True:
            future = self._try_submit(fn, args)
            if future is not None:
                return await asyncio.wrap_future(future)
            await self._wait_for_room()

    def shutdown(self, cancel_queued: bool = False) -> None:
        """Stop the threads once the running tasks (and, unless `cancel_queued`, the queued ones)
        finish. Blocking: call it from a worker thread."""
        self._pool.shutdown(wait=True, cancel_futures=cancel_queued)

    def _try_submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> Future[T] | None:
        with self._lock:
            if self._depth >= self.capacity:
                return None
            self._depth += 1
        try:
            future = self._pool.submit(fn, *args)
        except BaseException:  # shut down: nothing was queued
            self._task_done(None)
            raise
        future.add_done_callback(self._task_done)
        return future

    async def _wait_for_room(self) -> None:
        loop = asyncio.get_running_loop()
        room: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._depth < self.capacity:
                return  # a task finished since the failed attempt
            self._room.append((loop, room))
        await room

    def _task_done(self, future: Future[Any] | None) -> None:
        """Any thread: count the task out and wake every run() waiting for room (they retry)."""
        with self._lock:
            self._depth -= 1
            self.completed += future is not None
            waiting, self._room = self._room, []
        for loop, room in waiting:
            try:
                loop.call_soon_threadsafe(_wake, room)
            except RuntimeError:
                pass  # its loop closed: nobody waits any more


def _wake(room: asyncio.Future[None]) -> None:
    if not room.done():
        room.set_result(None)


@dataclass(frozen=True)
class BackgroundExecutors:
    """One bounded pool per kind of background disk work of a broker, so that no kind waits
    behind another: log flushes (fsyncs, which acks may wait for), offset checkpoints, retention,
    log creation/deletion and leader-epoch writes (`logs`), metadata store writes, the replay
    of `__consumer_offsets` partitions (`group_load`), a follower's appends and truncations
    (`replication`), and the decoding and encoding of large read requests (`large_reads`)."""

    flush: BoundedExecutor
    checkpoint: BoundedExecutor
    retention: BoundedExecutor
    logs: BoundedExecutor
    metadata: BoundedExecutor
    group_load: BoundedExecutor
    replication: BoundedExecutor
    large_reads: BoundedExecutor  # decoding and encoding of large read requests (broker/handlers/__init__.py)

    @classmethod
    def from_config(cls, config: BrokerConfig) -> BackgroundExecutors:
        return cls.create(config["background.threads"], config["background.queue.max.tasks"])

    @classmethod
    def create(cls, threads: int = 2, max_queued: int = 10_000) -> BackgroundExecutors:
        return cls(**{f.name: BoundedExecutor(f.name.replace("_", "-"), threads, max_queued) for f in fields(cls)})

    def all(self) -> list[BoundedExecutor]:
        return [getattr(self, f.name) for f in fields(self)]

    def shutdown(self) -> None:
        """Blocking: call from a worker thread once the broker queues no more work."""
        for executor in self.all():
            executor.shutdown()
