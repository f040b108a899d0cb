"""Purgatories: requests that wait for a partition's state to move (Kafka's DelayedOperation).

- `DelayedOperationPurgatory` holds `DelayedOperation`s (a fetch that found fewer than
  `min_bytes`; later a follower's fetch, a produce waiting for its ISR) watched under the
  partitions they wait on. When a partition's state moves (for fetches: its high watermark, not an
  append, since data above it is invisible to consumers) `notify` has each watcher try again on
  the next loop turn; a watcher that still cannot complete keeps watching until its deadline,
  when it completes with what there is. No task, future or coroutine per operation: a tailing
  consumer parks and wakes one fetch per record batch, and those were most of the broker's
  per-fetch work.
- `ProducePurgatory`: a produce whose acknowledgement must wait (the flush policy demands an
  fsync first; later, acks=all waits for the ISR) parks under its partition with the offset it
  needs; `complete` resolves every waiter whose condition now holds, `fail` every waiter of a
  partition (its log directory went offline).

Waking is O(waiters of that partition). Loop-local: call from the event-loop thread only.
"""
from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from common.topic_partition import TopicPartition

# Called once with (answer, None) or (None, error).
Completion = Callable[[Any, "BaseException | None"], None]


class DelayedOperation(abc.ABC):
    """An answer that waits for a condition or a deadline (Kafka's DelayedOperation). It completes
    exactly once: from `try_complete` once its condition holds, from `on_expiration` at its
    deadline, or never if cancelled (its requester went away). Whoever waits for the answer sets
    `on_complete` before the operation is watched."""

    def __init__(self, keys: Sequence[Hashable]) -> None:
        self.keys = keys
        self.done = False
        self.on_complete: Completion | None = None
        self._purgatory: DelayedOperationPurgatory | None = None
        self._timer: asyncio.TimerHandle | None = None

    @abc.abstractmethod
    def try_complete(self) -> bool:
        """Complete (through `complete`) if the condition now holds; return whether it did."""

    @abc.abstractmethod
    def on_expiration(self) -> None:
        """The deadline passed: complete with what there is."""

    def complete(self, answer: Any, error: BaseException | None = None) -> None:
        if self.done:
            return
        on_complete = self.on_complete
        self._finish()
        if on_complete is not None:
            on_complete(answer, error)

    def cancel(self) -> None:
        """Stop waiting without an answer."""
        if not self.done:
            self._finish()

    def _finish(self) -> None:
        # Drop every reference back to this operation (timer callback, requester's callback,
        # purgatory): a finished operation must be freed by reference counting. Thousands of
        # fetches a second left in cycles made the cyclic GC stop the broker for tens of ms.
        self.done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._purgatory is not None:
            self._purgatory._forget(self)
            self._purgatory = None
        self.on_complete = None

    def _attempt(self, step: Callable[[], Any]) -> None:
        """Run `try_complete` or `on_expiration`; a bug in either answers with the error instead
        of leaving the requester waiting."""
        try:
            step()
        except Exception as err:
            self.complete(None, err)


class DelayedOperationPurgatory:
    """Operations watched by key until they complete or expire (Kafka's DelayedOperationPurgatory)."""

    def __init__(self) -> None:
        self._watchers: dict[Hashable, dict[DelayedOperation, None]] = {}
        self._notified: set[Hashable] = set()

    def __len__(self) -> int:
        return len({op for ops in self._watchers.values() for op in ops})

    def watch(self, op: DelayedOperation, timeout_s: float) -> None:
        """Park `op` (whose first `try_complete` just failed) under its keys until a `notify` of
        one lets it complete, or `timeout_s` passes."""
        loop = asyncio.get_running_loop()
        op._purgatory = self
        for key in op.keys:
            self._watchers.setdefault(key, {})[op] = None
        op._timer = loop.call_later(max(timeout_s, 0.0), op._attempt, op.on_expiration)

    def notify(self, key: Hashable) -> None:
        """`key`'s state moved: its watchers try to complete on the next loop turn (after the
        request that moved it is answered; several moves in one turn make one attempt)."""
        if key in self._watchers and key not in self._notified:
            self._notified.add(key)
            asyncio.get_running_loop().call_soon(self._check, key)

    def _check(self, key: Hashable) -> None:
        self._notified.discard(key)
        for op in list(self._watchers.get(key, ())):
            if not op.done:
                op._attempt(op.try_complete)

    def expire_all(self) -> None:
        """Every parked operation completes now with what it has, as at its deadline (a stopping
        broker answers its parked fetches instead of dropping them)."""
        for op in {op for ops in self._watchers.values() for op in ops}:
            if not op.done:
                op._attempt(op.on_expiration)

    def _forget(self, op: DelayedOperation) -> None:
        for key in op.keys:
            ops = self._watchers.get(key)
            if ops is not None:
                ops.pop(op, None)
                if not ops:
                    del self._watchers[key]


class ProducePurgatory:
    """Produces parked under their partition until it has acknowledged the offsets they need.

    A produce is parked (`watch`) in the same loop turn as the check that found it unanswered,
    and its timer starts then: no `complete` can fall between the two and be missed. Parked only
    when its handler got round to awaiting it, a produce whose partition's high watermark moved
    meanwhile (the ISR shrank when a dead follower was dropped, while the handler awaited another
    partition of the request) waited for the next append or follower fetch that moved it again:
    after the last send, until its request timed out."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, list[tuple[int, int, asyncio.Future[None]]]] = {}

    def __len__(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    def watch(self, tp: TopicPartition, required_offset: int, acks: int, timeout_s: float) -> asyncio.Future[None]:
        """Park now: the future resolves once `complete` finds offsets below `required_offset`
        acknowledged for `acks`, fails with TimeoutError `timeout_s` from now, or with the error
        `fail` names if the partition fails first. Cancelling it (the requester went away)
        unparks it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (required_offset, acks, future)
        self._waiters.setdefault(tp, []).append(entry)
        timer = loop.call_later(max(timeout_s, 0.0), _expire, future, timeout_s)
        future.add_done_callback(lambda _: self._unpark(tp, entry, timer))
        return future

    def _unpark(self, tp: TopicPartition, entry: tuple[int, int, asyncio.Future[None]],
                timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        future = entry[2]
        if not future.cancelled():
            future.exception()  # its requester may have gone away before awaiting it: not an unretrieved error
        waiters = self._waiters.get(tp)
        if waiters is not None and entry in waiters:
            waiters.remove(entry)
            if not waiters:
                del self._waiters[tp]

    def complete(self, tp: TopicPartition, satisfied: Callable[[int, int], bool | BaseException]) -> None:
        """Resolve the waiters of `tp` for which `satisfied(required_offset, acks)` is True, and
        fail those for which it is an error (acks=all that found the ISR below its minimum)."""
        waiters = self._waiters.get(tp)
        if not waiters:
            return
        keep = []
        for entry in waiters:
            required_offset, acks, future = entry
            if future.done():
                continue
            outcome = satisfied(required_offset, acks)
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            elif outcome:
                future.set_result(None)
            else:
                keep.append(entry)
        if keep:
            self._waiters[tp] = keep
        else:
            del self._waiters[tp]

    def fail(self, tp: TopicPartition, err: BaseException) -> None:
        for _, _, future in self._waiters.pop(tp, []):
            if not future.done():
                future.set_exception(err)

    def partitions(self) -> list[TopicPartition]:
        return list(self._waiters)


def _expire(future: asyncio.Future[None], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"not acknowledged within {timeout_s} s"))
