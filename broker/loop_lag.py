"""LoopLagProbe: how late the broker's event loop runs a timer, measured always.

A timer callback due every `interval_s` (10 ms) records how much later than asked it ran: the
time the loop spent on something else (a callback that blocks, a stalled disk call made on the
loop) before it could run a ready timer. Every heartbeat, purgatory expiry and request waits as
long. The probe is a bare `call_at` chain (no task, future or sleep per tick). Cost: 100 wake-ups
a second, about 1.2-1.7 % of a core on an idle broker on the benchmark VM, nearly all of it the
kernel's timer wake-up (a 50 ms interval would cost a fifth, but miss stalls shorter than that);
a busy loop is awake anyway and pays almost nothing.

The lags go into a fixed-bucket histogram (`pymq_event_loop_lag_seconds`) and the worst one seen
into `max_s` (`pymq_event_loop_lag_max_seconds`); broker/metrics.py reads both at scrape time.
Benchmarks diff two scrapes for a window's percentiles.
"""
from __future__ import annotations

import asyncio

from broker.histogram import Histogram

# Upper bounds in seconds (Prometheus `le`), from timer noise to a stalled loop.
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class LoopLagProbe:
    def __init__(self, interval_s: float = 0.010) -> None:
        self.interval_s = interval_s
        self.lags = Histogram(LAG_BUCKETS_S)
        self.max_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._arm(asyncio.get_running_loop())

    async def stop(self) -> None:  # a shutdown step (Broker._stop_steps)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def record(self, lag_s: float) -> None:
        self.lags.observe(lag_s)
        self.max_s = max(self.max_s, lag_s)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        due = loop.time() + self.interval_s
        self._timer = loop.call_at(due, self._fire, loop, due)

    def _fire(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self.record(max(0.0, loop.time() - due))
        self._arm(loop)
