"""The log tests' building blocks: small segment limits, a topic id, record batches built with the
real codec, and partition logs opened through a LogManager that a test can close cleanly or
"crash" (drop without a final flush or checkpoint, as SIGKILL would). tests/broker/log/conftest.py
makes fixtures of them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from broker.config import LogConfig
from broker.log import LogManager, TopicLogSpec, UnifiedLog
from segment_format.batch_body import make_body
from segment_format.record import encode_batch
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


def idempotent_batch(producer_id: int, epoch: int, sequence: int, records: int = 3, attributes: int = 0,
                     timestamp_ms: int = 1_000) -> bytearray:
    """A producer's batch with a producer id, epoch and base sequence (build_batch's values)."""
    return encode_batch(make_body([b"value-0123"] * records, timestamps_ms=timestamp_ms), producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=sequence, attributes=attributes)


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
