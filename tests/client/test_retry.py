"""The readers' retry policy (client/retry.py): which errors are retried, and the back-off."""
from __future__ import annotations

import asyncio

import pytest

from client.config import RETRY_BACKOFF_MAX_S
from client.retry import Retry, retriable
from common.errors import CorruptMessageError, NetworkError, NotAPymqBrokerError, NotLeaderError, RequestTimedOutError


@pytest.mark.parametrize("error, expected", [
    (NotLeaderError("moved"), True), (NetworkError("lost"), True), (RequestTimedOutError("slow"), True),
    (NotAPymqBrokerError("an HTTP server"), False), (CorruptMessageError("damaged"), False), (ValueError("x"), False),
])
def test_the_error_class_decides_what_is_retried(error, expected):
    """A peer that is not a pymq broker is a NetworkError whose class says never retriable."""
    assert retriable(error) is expected


def test_back_offs_double_up_to_the_maximum_and_start_again_after_progress():
    retry = Retry(0.1)
    delays = [retry.next_delay_s() for _ in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_MAX_S])
    retry.reset()
    assert retry.next_delay_s() == pytest.approx(0.1)


def test_a_time_bound_raises_the_last_error_once_it_is_up():
    """With timeout_s 0 the first failure is already past the bound: its error is raised, no wait."""
    with pytest.raises(NotLeaderError):
        asyncio.run(Retry(0.01, timeout_s=0).back_off(NotLeaderError("moved")))
