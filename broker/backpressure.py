"""ByteBudget: bytes held against a limit, and who to wake when they drop back under it.

The broker bounds its memory the way Kafka's network layer does: it cannot refuse bytes already
received, so it admits every request it has read and stops *reading* while a budget is spent
(`transport.pause_reading`, Kafka's channel muting). Two budgets use this shape:

- `queued.max.request.bytes`: bytes of requests read and not yet answered, across all connections;
  while it is spent no connection reads.
- the log writer's queue (`log.writer.queued.max.bytes`): bytes of appends handed to the writer
  thread and not yet written; while it is spent the connections with produces in flight stop
  reading, and every other connection (metadata, heartbeats, fetches) is still served.

A large request frame is the exception: its size is known from its header before its body is
read, so the connection reserves the whole size (`try_reserve`) before reading it, and while the
budget has no room for it that connection alone stops reading (partly received frames count too,
and clients that announce large frames and send part of them hold no more than the budget).
Reserved bytes count in `used_bytes` and gate further reservations, but they never make the
budget `exhausted` (which stops every connection): a client that announces a frame and never
sends it must not stop everyone else's small requests while it waits out
`request.read.timeout.ms`. Held requests (admitted, waiting for their answer) do.

The same shape bounds one thing that is not bytes: `queued.max.response.descriptors`, the segment
descriptors held by responses queued on every connection and not yet sent; while it is spent
the connections with responses queued stop reading.

Because admission happens before the check, one holder larger than the whole limit is admitted
when nothing else is held (the limit is then spent until it is released): a request is never
refused for its size here, only by `socket.request.max.bytes`. A connection reads at most one
receive buffer (or one large frame) past the limit before it pauses.

Loop-local: acquire, release and the wake-up callbacks all run on the event loop.
"""
from __future__ import annotations

from collections.abc import Callable


class ByteBudget:
    def __init__(self, name: str, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError(f"{name}: the limit must be at least one byte, not {limit_bytes}")
        self.name = name
        self.limit_bytes = limit_bytes
        self.used_bytes = 0  # held and reserved
        self.reserved_bytes = 0
        self.peak_bytes = 0
        self._waiters: dict[Callable[[], None], None] = {}  # an ordered set: each woken once

    @property
    def exhausted(self) -> bool:
        """Whoever feeds the budget stops taking more while this holds (reservations aside)."""
        return self.used_bytes - self.reserved_bytes >= self.limit_bytes

    def acquire(self, nbytes: int) -> None:
        """Count bytes already in hand (never waits: see the module docstring)."""
        self.used_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def try_reserve(self, nbytes: int) -> bool:
        """Reserve `nbytes` not received yet if they fit under the limit, or if nothing is used (one
        frame larger than the whole limit must still be readable); else take nothing. A caller
        refused asks `wake_when_available` to try again."""
        if not self.has_room(nbytes):
            return False
        self.acquire(nbytes)
        self.reserved_bytes += nbytes
        return True

    def has_room(self, nbytes: int) -> bool:
        """Whether `try_reserve(nbytes)` would take them."""
        return not self.used_bytes or self.used_bytes + nbytes <= self.limit_bytes

    def unreserve(self, nbytes: int) -> None:
        """Give back a reservation (its frame arrived, and is acquired by whoever holds it, or the
        connection went)."""
        self.reserved_bytes -= nbytes
        assert self.reserved_bytes >= 0, (self.name, self.reserved_bytes, nbytes)
        self.release(nbytes)

    def release(self, nbytes: int) -> None:
        """Give bytes back; once under the limit, call everyone who asked to be woken."""
        self.used_bytes -= nbytes
        assert self.used_bytes >= 0, (self.name, self.used_bytes, nbytes)
        if self._waiters and not self.exhausted:
            waiters, self._waiters = self._waiters, {}
            for wake in waiters:
                wake()

    def wake_when_available(self, wake: Callable[[], None]) -> None:
        """Call `wake()` once the budget is under its limit again (once, however often asked)."""
        self._waiters[wake] = None
