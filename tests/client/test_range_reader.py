"""read_range against a scripted cluster: how it retries, and when it calls offsets lost."""
from __future__ import annotations

import asyncio
import time
from collections import deque

import pytest

from segment_format import batch_body, record
from client.range_reader import RangeStats, read_range
from common.errors import CorruptRecordError, DataLossError
from protocol import FetchPartitionResponse, FetchResponse, TopicResponse


def batch(base_offset: int, n: int) -> bytes:
    body = batch_body.make_body([f"v{base_offset + i}".encode() for i in range(n)], timestamps_ms=1_700_000_000_000)
    return bytes(record.encode_batch(body, base_offset=base_offset))


class ScriptedCluster:
    """Answers each Fetch with the next scripted (records, high watermark), the last one for ever;
    counts refreshes."""

    def __init__(self, answers: list[tuple[bytes, int]]) -> None:
        self.answers = deque(answers)
        self.refreshes = 0

    async def leader(self, topic: str, partition: int) -> int:
        return 0

    async def refresh(self, topics: list[str] | None = None) -> None:
        self.refreshes += 1

    async def send(self, node: int, request: object) -> FetchResponse:
        records, high_watermark = self.answers.popleft() if len(self.answers) > 1 else self.answers[0]
        answer = FetchPartitionResponse(0, high_watermark=high_watermark, log_start_offset=0, records=records)
        return FetchResponse((TopicResponse("t", (answer,)),))


async def collect(cluster: ScriptedCluster, start: int, end: int, retry_timeout_s: float = 0.1) -> list[int]:
    offsets = []
    async for chunk in read_range(cluster, "t", 0, start, end, retry_backoff_s=0.001,  # type: ignore[arg-type]
                                  retry_timeout_s=retry_timeout_s, stats=RangeStats()):
        for fetched in chunk:
            offsets.extend(range(fetched.first_offset, fetched.next_offset))
    return offsets


def test_a_lagging_high_watermark_is_retried_before_offsets_are_called_lost():
    """A fetch that finds the log ending below the range (a new leader catching up) is retried; the data then arrives."""
    cluster = ScriptedCluster([(b"", 0), (b"", 0), (batch(0, 5), 5)])
    assert asyncio.run(collect(cluster, 0, 5)) == [0, 1, 2, 3, 4]
    assert cluster.refreshes == 2


def test_offsets_still_missing_after_the_retries_are_data_loss():
    """A log that stays shorter than the range fails naming topic, partition and the missing offsets."""
    cluster = ScriptedCluster([(batch(0, 3), 3), (b"", 3)])
    with pytest.raises(DataLossError, match=r"t-0: offsets 3\.\.4 are not in the log") as caught:
        asyncio.run(collect(cluster, 0, 5))
    assert (caught.value.topic, caught.value.partition, caught.value.start, caught.value.end) == ("t", 0, 3, 5)


def test_retries_are_bounded_by_time_not_by_a_count():
    """However fast the failures come (1 ms backoff), the read retries for its whole retry timeout
    before it gives up."""
    cluster = ScriptedCluster([(batch(0, 3), 3), (b"", 3)])
    began = time.monotonic()
    with pytest.raises(DataLossError):
        asyncio.run(collect(cluster, 0, 5, retry_timeout_s=0.5))
    assert time.monotonic() - began >= 0.5  # a count of 5 retries at these backoffs ends in ~15 ms


def corrupted(data: bytes) -> bytes:
    """`data` with its last byte flipped: the batch's CRC no longer matches."""
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def test_a_corrupt_batch_the_range_needs_fails_it_naming_its_offset():
    """The records before a corrupt batch are delivered, then CorruptRecordError names topic, partition and offset."""
    cluster = ScriptedCluster([(batch(0, 3) + corrupted(batch(3, 3)), 6)])
    got: list[int] = []

    async def read() -> None:
        async for chunk in read_range(cluster, "t", 0, 0, 6, stats=RangeStats()):  # type: ignore[arg-type]
            for fetched in chunk:
                got.extend(range(fetched.first_offset, fetched.next_offset))

    with pytest.raises(CorruptRecordError) as caught:
        asyncio.run(read())
    assert got == [0, 1, 2]
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == ("t", 0, 3)


def test_a_corrupt_batch_past_the_range_is_not_read():
    """A range that ends before a corrupt batch reads its records and stops without error."""
    cluster = ScriptedCluster([(batch(0, 3) + corrupted(batch(3, 3)), 6)])
    assert asyncio.run(collect(cluster, 0, 3)) == [0, 1, 2]
