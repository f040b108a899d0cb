"""LoopThread: an event loop on a daemon thread, for the clients' synchronous facades.

The async clients are the real implementation; `Producer`, `Consumer` and `Admin` run one of them
on a private loop and call into it with `run`. Work that must not wait for the loop (the
producer's `send`) touches thread-safe structures directly instead.
"""
from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any, Coroutine, TypeVar

import uvloop

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Ctrl-C and SIGTERM are for the application's main thread, where Python runs signal
        # handlers: the kernel gives a process signal to any thread not blocking it, and a signal
        # taken here would leave the main thread blocked (reading stdin, say) until its call returns.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result in the calling thread. If the caller
        is interrupted (Ctrl-C, timeout), the coroutine is cancelled rather than left running.
        Called from the loop's own thread (e.g. `flush()` inside an `on_delivery` callback) it
        would wait for itself forever: that is a RuntimeError instead."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"{self._thread.name}: a blocking client call from the client's own I/O thread (e.g. "
                               "inside an on_delivery callback) would wait for itself")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        """Cancel what is still running on the loop, let it finish, then stop and close the loop."""
        if self.loop.is_running():
            try:
                self.run(self._cancel_pending(), 5)
            except (TimeoutError, RuntimeError):
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()

    @staticmethod
    async def _cancel_pending() -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
