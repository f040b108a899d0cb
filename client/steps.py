"""Steps: work shared between the application's thread and the client's event loop, written once
for an async client and its sync facade.

A consumer's poll, unsubscribe and close run application code (rebalance listeners, commit
callbacks) on the application's thread, as Kafka's do, and the protocol's work on the client's
loop. Both halves are written once, as coroutines of the async core: application code runs in
the coroutine itself, and every piece of the loop's work goes through a `Poller` (`poller.run(coro)`),
which knows where the coroutine runs:

  - `OnLoop`: the async client's caller is a coroutine on the client's loop; `run` awaits the
    work directly.
  - `OnThread`: the sync facade's caller is an application thread; `run` hands the work to the
    `LoopThread` and blocks for its result, so awaiting it never suspends. The facade runs the
    core's coroutine to completion on its own thread with `run_blocking`.

So the poll loop and the steps runner exist once, and the facade reaches the loop through one
path (LoopThread.run). Group work comes as `Steps` (generators, `ConsumerCoordinator.poll_steps`)
that `run_steps` drives.
"""
from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from client.loop_thread import LoopThread

T = TypeVar("T")
# Work the application's thread drives: it runs the generator (and so the application's
# callbacks) itself and hands every coroutine the generator yields to the client's loop.
Steps = Generator[Coroutine[Any, Any, Any], Any, T]


class Poller(Protocol):
    """Where a poll's caller runs, and how it gets the loop's work done (see the module docstring)."""

    def run(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """`work` run on the client's loop, as something the caller awaits."""
        ...

    def wait(self, blocking: Callable[[float], None], on_loop: Callable[[float], Awaitable[None]],
             timeout_s: float) -> Awaitable[None]:
        """Wait up to `timeout_s` for something to arrive: on a thread with `blocking` (no loop hop),
        on the loop with `on_loop`."""
        ...


class OnLoop:
    """The async client's poller: a coroutine on the client's own loop."""

    def run(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return work

    def wait(self, blocking: Callable[[float], None], on_loop: Callable[[float], Awaitable[None]],
             timeout_s: float) -> Awaitable[None]:
        return on_loop(timeout_s)


class OnThread:
    """The sync facade's poller: an application thread beside the client's `LoopThread`. Every
    method blocks and returns an awaitable that is already done."""

    def __init__(self, thread: LoopThread) -> None:
        self.thread = thread

    def run(self, work: Coroutine[Any, Any, T]) -> Awaitable[T]:
        return Done(self.thread.run(work))

    def wait(self, blocking: Callable[[float], None], on_loop: Callable[[float], Awaitable[None]],
             timeout_s: float) -> Awaitable[None]:
        blocking(timeout_s)
        return Done(None)


class Done(Awaitable[T]):
    """A result already at hand: awaiting it returns it without suspending."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, T]:
        return self.value
        yield  # a generator function that returns at once: awaiting it never suspends


def run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run a core coroutine to completion on the calling thread. Every await in it must be of an
    `OnThread` poller's (it never suspends); one that would suspend is a RuntimeError."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError(f"{work!r} waited for the event loop on an application thread: its loop work must go "
                       "through an OnThread poller")


async def run_steps(steps: Steps[T], poller: Poller) -> T:
    """Drive `steps` on the caller's side (the generator's application code runs there) and each
    coroutine it yields through `poller`; the coroutine's result or exception goes back into the
    generator, which decides."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = await poller.run(step)
        except Exception as err:  # handed back to the generator, which decides
            error = err
