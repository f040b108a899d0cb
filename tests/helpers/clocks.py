"""Clocks that move only when a test says so (Kafka's MockTime): `FakeClock`, milliseconds as a
callable (the log layer's clock); `ManualClock`, a monotonic clock with timers (the local
metadata store's leases)."""
from __future__ import annotations

from collections.abc import Callable


class FakeClock:
    """Kafka's MockTime: milliseconds that move only when a test says so."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class ManualClock:
    """A Clock that moves only when told: `advance` fires the timers that fall due, in order."""

    class _Timer:
        def __init__(self, due: float, callback: Callable[[], None]) -> None:
            self.due, self.callback, self.cancelled = due, callback, False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self) -> None:
        self.now = 1000.0
        self._timers: list[ManualClock._Timer] = []

    def monotonic(self) -> float:
        return self.now

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> "ManualClock._Timer":
        timer = self._Timer(self.now + max(delay_s, 0.0), callback)
        self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = sorted((t for t in self._timers if t.due <= self.now and not t.cancelled), key=lambda t: t.due)
        self._timers = [t for t in self._timers if t not in due and not t.cancelled]
        for timer in due:
            timer.callback()
