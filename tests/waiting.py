"""The suite's one way to wait: poll a condition until it holds, never a bare sleep."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """The first truthy value of `condition()`, polled every `interval_s`; AssertionError naming
    `what` if none comes within `timeout_s`. Exceptions from `condition` propagate."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(interval_s)
