"""LogWriter: large appends run on a writer thread while the event loop serves the next request.

An append is a CRC32C over every byte and a pwrite of all of them; both release the GIL. Run on
the event loop they stall it for the whole request (the py-spy profile of sustained ingest: 44 %
pwrite, 28 % CRC), so a produce of a few MiB is handed to one writer thread instead and the loop
goes on receiving. Small appends stay inline: below `offload_bytes` the thread hand-off costs more
than the work, and the latency-sensitive traffic is small.

Order: one thread, first in first out, and a partition that has appends queued gets every later
append queued behind them, however small. So a partition's appends happen in arrival order, as
they would inline.

Memory: queued payloads are request buffers held until written, counted in `queue` (a
ByteBudget of `max_queued_bytes`). The writer never waits for room: the loop must not block on
the disk. While the queue is spent, the server stops reading from the connections that produce
(broker/backpressure.py) and goes on serving every other one; they resume when it drains.
Loop-local: call from the event-loop thread only.
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from broker.backpressure import ByteBudget
from broker.log import AppendInfo, UnifiedLog


class LogWriter:
    def __init__(self, offload_bytes: int, max_queued_bytes: int) -> None:
        self.offload_bytes = offload_bytes
        self.queue = ByteBudget("log writer queue", max_queued_bytes)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pymq-log-writer")
        self._queued: dict[UnifiedLog, int] = {}  # appends submitted and not yet finished, per log

    def append(self, partition_log: UnifiedLog, data: memoryview, leader_epoch: int,
               coordinator: bool = False) -> AppendInfo | asyncio.Future[AppendInfo]:
        """Append now (small, nothing queued for this log) or on the writer thread (a future).
        Either way UnifiedLog.append_as_leader's errors are its errors: raised, or set on the future.
        `coordinator`: the broker's own coordinator writes it (UnifiedLog.append_as_leader)."""
        if len(data) < self.offload_bytes and partition_log not in self._queued:
            return partition_log.append_as_leader(data, leader_epoch, coordinator)
        size = len(data)
        self.queue.acquire(size)
        self._queued[partition_log] = self._queued.get(partition_log, 0) + 1
        future = asyncio.wrap_future(self._executor.submit(partition_log.append_as_leader, data, leader_epoch, coordinator))
        future.add_done_callback(lambda _: self._finished(partition_log, size))
        return future

    def _finished(self, partition_log: UnifiedLog, size: int) -> None:
        left = self._queued.pop(partition_log) - 1
        if left:
            self._queued[partition_log] = left
        self.queue.release(size)

    async def close(self) -> None:
        """Wait for queued appends to finish (they are acknowledged writes) and stop the thread."""
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
