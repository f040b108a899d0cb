"""Fixtures for the log tests: record batches built with the real codec, an injectable clock,
partition logs opened through a LogManager in tmp_path, so that a clean close writes the
directory's offset checkpoints and a reopen reads them, while a "crash" drops the logs without
either (the next open recovers from the files alone), and a UnifiedLog opened directly for tests
where the manager is not the point (the caller passes the offsets a manager would)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from pathlib import Path

import pytest

from broker.config import LogConfig
from broker.log import FileCache, LogManager, TopicLogSpec, UnifiedLog
from segment_format.record import encode_batch
from segment_format.batch_body import make_body
from tests.helpers.clocks import FakeClock

# Small limits so that a handful of ~1 KiB batches fill a segment.
SMALL = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)
TOPIC_ID = "0123456789abcdef0123456789abcdef"


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
def cache() -> Iterator[FileCache]:
    """The descriptor cache segments share (its size is exercised in test_file_cache.py)."""
    files = FileCache()
    yield files
    files.close()


def crash(manager: LogManager) -> None:
    """Drop every log of `manager` as SIGKILL would: no final flush, no checkpoint, queued index
    entries lost; the files stay as they are for the next open to recover."""
    for partition_log in manager.all_logs():
        partition_log._closed = True  # a later close() must not flush or checkpoint
        for segment in partition_log.segments():
            segment._close_indexes()
    manager.cache.close()


class Logs:
    """Open the one log `topic-0` of a LogManager in `directory`, again and again: `open()` after
    `close()` (clean: checkpoints written) or `crash()` (nothing written) reopens it."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.directory = directory
        self.clock = clock
        self.manager: LogManager | None = None

    def open(self, **overrides: object) -> UnifiedLog:
        if self.manager is not None:
            self.close()
        self.manager = LogManager(self.directory, self.clock)
        logs = self.manager.load({"topic": TopicLogSpec(TOPIC_ID, replace(SMALL, **overrides), 1)})
        return logs[("topic", 0)]

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
            self.manager = None

    def crash(self) -> None:
        """Forget the logs without a final flush or checkpoint (as SIGKILL would)."""
        if self.manager is not None:
            crash(self.manager)
            self.manager = None


@pytest.fixture
def logs(tmp_path: Path, clock: FakeClock):
    opened = Logs(tmp_path / "data", clock)
    yield opened
    opened.close()


@pytest.fixture
def open_log(logs: Logs) -> Callable[..., UnifiedLog]:
    """open_log(**config_overrides) -> the log of tmp_path/data/topic-0 (the same directory each
    call, so calling it again after a close or crash reopens the log)."""
    return logs.open


@pytest.fixture
def crash_log(logs: Logs) -> Callable[[UnifiedLog], None]:
    """crash_log(log): drop the open log (and its manager) without a clean close."""
    return lambda partition_log: logs.crash()


@pytest.fixture
def unified_log(tmp_path: Path, clock: FakeClock):
    """unified_log(**overrides) -> UnifiedLog.open of tmp_path/direct/topic-0 with a FileCache of its
    own; overrides naming a LogConfig field change SMALL, the others are UnifiedLog.open's keywords
    (recovery_point, high_watermark, ...). Every log opened is closed (cleanly) at teardown."""
    cache = FileCache()
    opened: list[UnifiedLog] = []
    config_fields = {f.name for f in fields(LogConfig)}

    def open_direct(**overrides: object) -> UnifiedLog:
        config = replace(SMALL, **{k: v for k, v in overrides.items() if k in config_fields})
        kwargs = {k: v for k, v in overrides.items() if k not in config_fields}
        partition_log = UnifiedLog.open(tmp_path / "direct" / "topic-0", "topic", 0, config, cache=cache,
                                        clock=clock, **kwargs)
        opened.append(partition_log)
        return partition_log

    yield open_direct
    for partition_log in opened:
        partition_log.close()
    cache.close()
