"""Fixtures for the log tests: record batches built with the real codec, an injectable clock, and
partition logs in tmp_path that are closed at teardown."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from broker.config import LogConfig
from broker.log import PartitionLog
from broker.record import encode_batch, make_body

# Small limits so that a handful of ~1 KiB batches fill a segment.
SMALL = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)


class FakeClock:
    """Kafka's MockTime: milliseconds that move only when a test says so."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def build_batch(
    records: int = 1,
    timestamp_ms: int | list[int] = 1_000,
    value: bytes = b"value-0123",
    base_offset: int = 0,
) -> bytearray:
    """One encoded batch of `records` equal values (equal arguments give equal sizes)."""
    return encode_batch(make_body([value] * records, timestamps_ms=timestamp_ms), base_offset=base_offset)


@pytest.fixture
def batch() -> Callable[..., bytearray]:
    return build_batch


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def small_config() -> LogConfig:
    return SMALL


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock):
    """open_log(**config_overrides) -> PartitionLog in tmp_path/'topic-0' (same dir each call,
    so calling it again after a close or crash reopens the log)."""
    opened: list[PartitionLog] = []

    def _open(**overrides) -> PartitionLog:
        partition_log = PartitionLog.open(tmp_path / "topic-0", "topic", 0, replace(SMALL, **overrides), clock)
        opened.append(partition_log)
        return partition_log

    yield _open
    for partition_log in opened:
        partition_log.close()


def crash(partition_log: PartitionLog) -> None:
    """Drop a log's fds without a clean close: no final sync, no recovery-point checkpoint."""
    for segment in partition_log.segments():
        segment.close()
    partition_log._closed = True  # the fixture's teardown close() must not checkpoint


@pytest.fixture
def crash_log() -> Callable[[PartitionLog], None]:
    return crash
