"""The readers' retry policy, in one place (the consumer's Fetcher and the range reader use it).

Which errors are worth another attempt: those whose class says so (`PymqError.retriable`): a
leader not known yet or moving (NOT_LEADER, LEADER_NOT_AVAILABLE), a timeout, a lost connection
(NetworkError), a topic missing for a moment. A peer that is not a pymq broker
(NotAPymqBrokerError, a NetworkError whose class says not retriable) never becomes one: it fails
at once rather than after a retry timeout. Between attempts the reader backs off (from
`retry_backoff_ms`, doubling up to Kafka's retry.backoff.max.ms) and refreshes metadata, so a
moved leader is found; progress resets the back-off.
"""
from __future__ import annotations

import asyncio
import time

from client.config import RETRY_BACKOFF_MAX_S
from common.errors import PymqError


def retriable(err: BaseException) -> bool:
    """Whether another attempt (after a back-off and a metadata refresh) may succeed."""
    return isinstance(err, PymqError) and err.retriable


class Retry:
    """A reader's attempts since its last progress: back-offs double from `backoff_s` up to
    max(RETRY_BACKOFF_MAX_S, backoff_s); with `timeout_s`, attempts stop `timeout_s` after the
    first failure since the last progress (a time bound, not a count, so that a burst of fast
    failures does not end a read a slower one would not)."""

    def __init__(self, backoff_s: float, timeout_s: float | None = None) -> None:
        self.backoff_s = backoff_s
        self.max_backoff_s = max(RETRY_BACKOFF_MAX_S, backoff_s)
        self.timeout_s = timeout_s
        self.reset()

    def reset(self) -> None:
        """The reader made progress: the next failure starts afresh."""
        self.failures = 0
        self.since_s: float | None = None

    async def back_off(self, err: PymqError) -> None:
        """Wait before the next attempt after `err`, or raise `err` when the time bound is up."""
        now = time.monotonic()
        if self.since_s is None:
            self.since_s = now
        left_s = float("inf") if self.timeout_s is None else self.since_s + self.timeout_s - now
        if left_s <= 0:
            raise err
        await asyncio.sleep(min(self.next_delay_s(), left_s))

    def next_delay_s(self) -> float:
        """The wait before the next attempt (counted as one more failure)."""
        delay_s = min(self.backoff_s * 2 ** min(self.failures, 32), self.max_backoff_s)
        self.failures += 1
        return delay_s
