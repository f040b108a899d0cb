"""LoopLagProbe: how late the broker's event loop runs a timer, measured always.

A task sleeps `interval_s` (10 ms) at a time and records how much later than asked it woke: the
time the loop spent on something else (a callback that blocks, a stalled disk call made on the
loop) before it could run a ready timer. Every heartbeat, purgatory expiry and request waits as
long. Cost: one wake-up per interval and a bisect, about 0.1 % of a core.

The lags go into a fixed-bucket histogram (`pymq_event_loop_lag_seconds`) and the worst one seen
into `max_s` (`pymq_event_loop_lag_max_seconds`); broker/metrics.py reads both at scrape time.
Benchmarks diff two scrapes for a window's percentiles.
"""
from __future__ import annotations

import asyncio
import bisect

# Upper bounds in seconds (Prometheus `le`), from timer noise to a stalled loop.
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class LoopLagProbe:
    def __init__(self, interval_s: float = 0.010) -> None:
        self.interval_s = interval_s
        self.counts = [0] * (len(LAG_BUCKETS_S) + 1)  # per bucket, the last one above every bound
        self.sum_s = 0.0
        self.max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def record(self, lag_s: float) -> None:
        self.counts[bisect.bisect_left(LAG_BUCKETS_S, lag_s)] += 1
        self.sum_s += lag_s
        self.max_s = max(self.max_s, lag_s)

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.record(max(0.0, loop.time() - due))
