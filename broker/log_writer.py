"""LogWriter: large appends run on a writer thread while the event loop serves the next request.

An append is a CRC32C over every byte and a pwrite of all of them; both release the GIL. Run on
the event loop they stall it for the whole request (the py-spy profile of sustained ingest: 44 %
pwrite, 28 % CRC), so a produce of a few MiB is handed to one writer thread instead and the loop
goes on receiving. Small appends stay inline: below `offload_bytes` the thread hand-off costs more
than the work, and the latency-sensitive traffic is small.

Order: one thread, first in first out, and a partition that has appends queued gets every later
append queued behind them, however small. So a partition's appends happen in arrival order, as
they would inline.

Memory: queued payloads are request buffers held until written. Past `max_queued_bytes` the
next append waits, on the event loop, for the oldest ones to finish: the loop then reads no more
requests, which is the backpressure an inline append gave. Loop-local: call from the event-loop
thread only.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque

from broker.log import AppendInfo, UnifiedLog


class LogWriter:
    def __init__(self, offload_bytes: int, max_queued_bytes: int) -> None:
        self.offload_bytes = offload_bytes
        self.max_queued_bytes = max_queued_bytes
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pymq-log-writer")
        self._queued: dict[UnifiedLog, int] = {}  # appends submitted and not yet finished, per log
        self._submitted: deque[tuple[concurrent.futures.Future[AppendInfo], int]] = deque()  # oldest first
        self._submitted_bytes = 0

    def append(self, partition_log: UnifiedLog, data: memoryview,
               leader_epoch: int) -> AppendInfo | asyncio.Future[AppendInfo]:
        """Append now (small, nothing queued for this log) or on the writer thread (a future).
        Either way UnifiedLog.append_as_leader's errors are its errors: raised, or set on the future."""
        if len(data) < self.offload_bytes and partition_log not in self._queued:
            return partition_log.append_as_leader(data, leader_epoch)
        self._make_room(len(data))
        self._queued[partition_log] = self._queued.get(partition_log, 0) + 1
        submitted = self._executor.submit(partition_log.append_as_leader, data, leader_epoch)
        self._submitted.append((submitted, len(data)))
        self._submitted_bytes += len(data)
        future = asyncio.wrap_future(submitted)
        future.add_done_callback(lambda _: self._finished(partition_log))
        return future

    def _make_room(self, nbytes: int) -> None:
        """Forget finished appends; block until the queue has room for `nbytes` more (or is empty)."""
        while self._submitted and (self._submitted[0][0].done()
                                   or self._submitted_bytes + nbytes > self.max_queued_bytes):
            oldest, size = self._submitted.popleft()
            concurrent.futures.wait([oldest])
            self._submitted_bytes -= size

    def _finished(self, partition_log: UnifiedLog) -> None:
        left = self._queued.pop(partition_log) - 1
        if left:
            self._queued[partition_log] = left

    async def close(self) -> None:
        """Wait for queued appends to finish (they are acknowledged writes) and stop the thread."""
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
