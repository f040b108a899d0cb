"""Running a streaming query with Trigger.AvailableNow to its end, as the Spark tests do."""
from __future__ import annotations

from typing import Any


def run_to_end(query: Any, timeout_s: float = 120) -> list[Any]:
    """Wait for an AvailableNow `query` to stop by itself, fail on its exception, stop it in any
    case; its micro-batches' progress."""
    try:
        assert query.awaitTermination(timeout_s), "Trigger.AvailableNow did not stop"
        assert query.exception() is None, query.exception()
        return query.recentProgress
    finally:
        query.stop()


def batches_with_rows(progress: list[Any]) -> int:
    """How many of the micro-batches read rows."""
    return sum(1 for p in progress if p["numInputRows"])
