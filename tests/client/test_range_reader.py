"""read_range against a scripted cluster: how it retries, and when it calls offsets lost."""
from __future__ import annotations

import asyncio
import time
from collections import deque

import pytest

from client.cluster import Cluster
from client.range_reader import RangeStats, read_range
from common.errors import CorruptMessageError, CorruptRecordError, DataLossError, NotAPymqBrokerError, NotLeaderError
from protocol import ApiKey, FetchPartitionResponse, FetchRequest, FetchResponse, MetadataRequest, TopicResponse
from segment_format import batch_body, record
from tests.client.fake_cluster import FakeCluster


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


# -- against the fake cluster (tests/client/fake_cluster.py): real frames, the client's own Cluster --


def read_fake(script, start: int, end: int, *, retry_timeout_s: float = 30.0, stats: RangeStats | None = None) -> list[int]:
    """Offsets read_range returns for t-0 [start, end) from a fake cluster that `script(cluster)` set up."""

    async def run() -> list[int]:
        fake = await FakeCluster(nodes=2).start()
        cluster = Cluster(fake.bootstrap, request_timeout_ms=10_000)
        try:
            script(fake)
            offsets: list[int] = []
            async for chunk in read_range(cluster, "t", 0, start, end, retry_backoff_s=0.01,
                                          retry_timeout_s=retry_timeout_s, stats=stats):
                for fetched in chunk:
                    offsets.extend(range(fetched.first_offset, fetched.next_offset))
            read_fake.fake = fake  # type: ignore[attr-defined]  # for the test's checks of what was sent
            return offsets
        finally:
            await cluster.close()
            await fake.close()

    return asyncio.run(run())


def three_batches(fake: FakeCluster) -> None:
    """t-0 holds offsets 0..8 in batches of 3 on node 0."""
    fake.add_topic("t", 1, leader=0)
    for base in (0, 3, 6):
        fake.append("t", 0, batch(base, 3))


def test_a_range_ends_exactly_at_its_end_offset_and_fetches_nothing_past_it():
    """[1, 5) of batches [0,3) [3,6) [6,9): offsets 1..4, trimmed in the batch that holds the end,
    and no Fetch asks for the offsets at or after the end."""
    stats = RangeStats()
    assert read_fake(three_batches, 1, 5, stats=stats) == [1, 2, 3, 4]
    fetched_at = [p.fetch_offset for r in read_fake.fake.sent(FetchRequest) for t in r.topics for p in t.partitions]
    assert fetched_at == [1, 3] and stats.records == 4


def test_not_leader_is_retried_on_the_leader_fresh_metadata_names():
    """The leader moved to node 1 after the reader's metadata was loaded: node 0 answers
    NOT_LEADER, the reader refreshes metadata and reads from node 1."""

    def moved(fake: FakeCluster) -> None:
        three_batches(fake)
        fake.fail(ApiKey.FETCH, NotLeaderError, node=0, times=None)  # node 0 led when metadata was read, not now
        fake.fail(ApiKey.FETCH, NotLeaderError, node=1, times=1)  # the new leader not ready at once: retried too

    def script(fake: FakeCluster) -> None:
        moved(fake)
        fake.move_leader("t", 0, 1)

    assert read_fake(script, 0, 9) == list(range(9))
    fake = read_fake.fake
    assert len(fake.sent(FetchRequest, node=1)) >= 2  # the NOT_LEADER of node 1 was retried
    assert len(fake.sent(MetadataRequest)) >= 2  # refreshed after NOT_LEADER


def test_a_retriable_error_that_persists_gives_up_after_the_retry_timeout_naming_it():
    """NOT_LEADER for ever (metadata keeps naming the same leader): NotLeaderError once the retry
    timeout passed without progress, after several backed-off attempts."""

    def script(fake: FakeCluster) -> None:
        three_batches(fake)
        fake.fail(ApiKey.FETCH, NotLeaderError, times=None)

    with pytest.raises(NotLeaderError):
        read_fake(script, 0, 9, retry_timeout_s=0.3)


def test_a_non_retriable_broker_error_fails_the_read_at_once():
    """CORRUPT_MESSAGE (a damaged log) is not retried: one Fetch, then the broker's error."""
    fakes: list[FakeCluster] = []

    def script(fake: FakeCluster) -> None:
        three_batches(fake)
        fake.fail(ApiKey.FETCH, CorruptMessageError, times=None)
        fakes.append(fake)

    with pytest.raises(CorruptMessageError):
        read_fake(script, 0, 9)
    assert len(fakes[0].sent(FetchRequest)) == 1


def test_a_peer_that_is_not_a_pymq_broker_fails_the_read_at_once():
    """A plain TCP server answering garbage (an HTTP server on the port) is never a broker:
    NotAPymqBrokerError at once, not after the retry timeout (here 10 minutes) of retriable errors."""

    async def run() -> None:
        async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

        server = await asyncio.start_server(garbage, "127.0.0.1", 0)
        cluster = Cluster(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", request_timeout_ms=10_000)
        try:
            async with asyncio.timeout(60):  # generous: a retried error would take the 600 s retry timeout
                async for _ in read_range(cluster, "t", 0, 0, 9, retry_backoff_s=0.01, retry_timeout_s=600):
                    pass
        finally:
            await cluster.close()
            server.close()

    with pytest.raises(NotAPymqBrokerError, match="is not a pymq broker"):
        asyncio.run(run())
