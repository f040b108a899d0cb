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
from broker.log import FileCache, UnifiedLog
from tests.helpers.clocks import FakeClock
from tests.helpers.logs import SMALL, Logs, build_batch

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
