"""RemoteLogReader (broker/remote_log/remote_log_reader.py) against a real file:// store holding real
segments uploaded by a RemoteLogManager: remote reads answer the bytes the local log answered
before local retention deleted it, the loop-side `read` never blocks and wakes its retry through
`on_ready`, errors reach the retry, a bad index only costs a scan, prefetch loads what a
sequential reader needs next, the chunk cache stays within its bytes, offset_for_timestamp finds
the first record at or after a time, and concurrent readers agree.

The store is never mocked; tests that count ranged GETs wrap the store instance's `read_range`."""
from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from segment_format import batch_body, record
from common.errors import CorruptMessageError, OffsetOutOfRangeError, WorkQueueFullError
from broker.log import FileCache, UnifiedLog
from segment_format.index_file import OFFSET_INDEX, SparseIndex
from broker.remote_log.remote_log_manager import RemoteLogManager
from broker.remote_log.remote_log_reader import ChunkCache, RemoteLogReader, RemoteReadPending
from tests.broker.log.appends import append
from tests.helpers.logs import SMALL, TOPIC_ID
from tests.helpers.clocks import FakeClock
from tiered_storage import RemoteObjectNotFoundError, RemoteSegmentStore, RemoteStorageError
from segment_format.manifest import PartitionManifest, RemoteSegment
from tests.waiting import wait_until

TOPIC, PARTITION = "topic", 0
KIB = 1 << 10
CHUNK = 64 * KIB  # remote.log.reader.chunk.bytes' minimum
SEGMENT_BYTES = 200 * KIB  # about three chunks and a bit per segment
# Tiered, everything uploaded may go locally, sparse offset index (lookups end in a short scan).
CONFIG = replace(SMALL, remote_storage_enable=True, local_retention_bytes=0, retention_ms=-1,
                 segment_bytes=SEGMENT_BYTES, max_message_bytes=1 << 20, index_interval_bytes=4096)
FIRST_TIMESTAMP = 100_000  # record n has timestamp FIRST_TIMESTAMP + 3 * n (the clock is at 1_000_000)
MAX_BYTES = (1, 5_000, 30_000)  # read sizes compared for every batch (1: KIP-74, the first batch whole)
WAIT_S = 5.0


@dataclass(frozen=True)
class Tiered:
    """A log uploaded to the store at `root`, then deleted locally, and what was read before."""

    root: Path
    manifest: PartitionManifest
    batches: list[tuple[int, int, int]]  # (base_offset, next_offset, size) of every uploaded batch
    timestamps: list[int]  # of every record, by offset, uploaded or not
    local_reads: dict[tuple[int, int], bytes]  # (offset, max_bytes) -> the local read's bytes
    local_offset_for_timestamp: dict[int, tuple[int, int] | None]  # the local log's answers


def _batch_sizes(rng: random.Random, count: int) -> Iterator[tuple[int, int]]:
    """(records, value size) per batch: mostly ~1 KiB batches, some of ~60 KiB (they straddle
    chunk boundaries) and one larger than a chunk."""
    for i in range(count):
        if i == 150:
            yield 40, 2_000  # ~80 KiB: spans two chunk boundaries
        elif i % 61 == 30:
            yield 30, 2_000
        else:
            yield rng.randint(1, 12), 100


def whole_batches(data: bytes) -> bytes:
    """`data` without a batch cut at its end (a local read may end mid-batch; a remote one never)."""
    end = 0
    for position, header in record.iter_batches(data, verify=False):
        end = position + header.size
    return data[:end]


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Tiered:
    tmp = tmp_path_factory.mktemp("tiered")
    clock = FakeClock()
    partition_log = UnifiedLog.open(tmp / "data" / "topic-0", TOPIC, PARTITION, CONFIG, topic_id=TOPIC_ID,
                                    cache=FileCache(), clock=clock, remote_storage=True)
    store = RemoteSegmentStore.from_url(f"file://{tmp}/remote")
    rlm = RemoteLogManager(store, clock=clock)
    rlm.on_leadership_change([(partition_log, 0)], [])
    try:
        rng = random.Random(20240501)
        timestamps: list[int] = []
        for i, (records, value_size) in enumerate(_batch_sizes(rng, 400)):
            ts = [FIRST_TIMESTAMP + 3 * (len(timestamps) + j) for j in range(records)]
            timestamps += ts
            append(partition_log, record.encode_batch(batch_body.make_body([bytes([i % 251]) * value_size] * records,
                                                                           timestamps_ms=ts)))
        partition_log.flush()
        sealed = partition_log.segments()[:-1]
        assert len(sealed) >= 4 and all(s.size > 2 * CHUNK for s in sealed[:3])
        batches = []
        for segment in sealed:
            data = segment.log_path.read_bytes()
            batches += [(h.base_offset, h.next_offset, h.size) for _, h in record.iter_batches(data)]
        remote_end = sealed[-1].next_offset
        assert batches[-1][1] == remote_end
        # What the local log answers, read before local retention deletes it.
        local_reads = {}
        for n, (base, next_offset, _) in enumerate(batches):
            inside = [base, (base + next_offset - 1) // 2] if next_offset - base > 2 else [base]
            for offset in inside:
                for max_bytes in MAX_BYTES if offset == base else (1, 30_000):
                    local_reads[offset, max_bytes] = partition_log.read(offset, max_bytes).read_bytes()
            if n % 10 == 0:
                local_reads[base, 1 << 20] = partition_log.read(base, 1 << 20).read_bytes()
        probe_times = {FIRST_TIMESTAMP - 1, timestamps[remote_end - 1], timestamps[remote_end - 1] + 1}
        probe_times |= {timestamps[s.base_offset] for s in sealed} | {timestamps[s.base_offset] + 1 for s in sealed}
        local_oft = {t: partition_log.offset_for_timestamp(t) for t in probe_times}
        rlm.run_once()
        manifest = store.load_manifest(TOPIC, PARTITION)
        assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in sealed]
        assert manifest.log_start_offset == 0 and manifest.log_end_offset == remote_end
        for segment in partition_log.delete_old_segments(clock()):
            segment.delete()
        with pytest.raises(OffsetOutOfRangeError, match="remote storage"):  # moved to the remote tier
            partition_log.read(0, 1)
    finally:
        rlm.close()
        partition_log.close()
    return Tiered(tmp / "remote", manifest, batches, timestamps, local_reads, local_oft)


@pytest.fixture
def store(tiered: Tiered) -> RemoteSegmentStore:
    """A store over the shared, never modified, uploaded log."""
    return RemoteSegmentStore.from_url(f"file://{tiered.root}")


@pytest.fixture
def own_store(tiered: Tiered, tmp_path: Path) -> RemoteSegmentStore:
    """A store over a copy of the uploaded log, for tests that damage objects."""
    shutil.copytree(tiered.root, tmp_path / "remote")
    return RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")


@pytest.fixture
def make_reader() -> Iterator[Callable[..., RemoteLogReader]]:
    """make_reader(store, **kwargs): a RemoteLogReader closed at teardown."""
    readers: list[RemoteLogReader] = []

    def make(store: RemoteSegmentStore, **kwargs: object) -> RemoteLogReader:
        reader = RemoteLogReader(store, **kwargs)  # type: ignore[arg-type]
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.close()


class RangeCounter:
    """Wraps a store instance's `read_range` to record every ranged GET (segment base, position,
    size); `gate`, when cleared, holds every GET until it is set."""

    def __init__(self, store: RemoteSegmentStore) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._lock = threading.Lock()
        real = store.read_range

        def read_range(topic: str, partition: int, segment: RemoteSegment, position: int, size: int) -> bytes:
            with self._lock:
                self.calls.append((segment.base_offset, position, size))
            self.entered.set()
            assert self.gate.wait(WAIT_S * 2), "gate never opened"
            return real(topic, partition, segment, position, size)

        store.read_range = read_range  # type: ignore[method-assign]

    def __len__(self) -> int:
        with self._lock:
            return len(self.calls)


class Ready:
    """An `on_ready` that records its calls and sets an event."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.event = threading.Event()

    def __call__(self, key: tuple[str, int]) -> None:
        self.calls.append(key)
        self.event.set()

    def wait(self) -> None:
        assert self.event.wait(WAIT_S), "on_ready was never called"
        self.event.clear()


def settle(reader: RemoteLogReader) -> None:
    """Wait until the reader's workers are idle: no worker read or prefetch queued or running, and
    no chunk or index loading. A read submits its prefetches before it returns, and a worker task
    counts until it has finished (cache puts and on_ready included), so nothing more happens after."""
    wait_until(lambda: reader._executor.depth == 0 and not reader._loading, WAIT_S,
               "no worker read or prefetch queued or running", 0.005)


def expected(tiered: Tiered, offset: int, max_bytes: int) -> bytes:
    return whole_batches(tiered.local_reads[offset, max_bytes])


def batch_at(tiered: Tiered, offset: int) -> tuple[int, int, int]:
    return next(b for b in tiered.batches if b[0] <= offset < b[1])


def chunk_key(segment: RemoteSegment, k: int) -> tuple[str, int, str, int]:
    return TOPIC, PARTITION, segment.upload_id, k


def batch_positions(store: RemoteSegmentStore, segment: RemoteSegment) -> list[tuple[int, record.BatchHeader]]:
    data = store.read_range(TOPIC, PARTITION, segment, 0, segment.size_bytes)
    return list(record.iter_batches(data, verify=False))


# --- 1. equivalence with the local log ---------------------------------------------------------

@pytest.mark.parametrize("chunk_bytes", [CHUNK, 4 << 20])
def test_read_blocking_answers_the_bytes_the_local_log_answered(tiered, store, make_reader, chunk_bytes):
    """For every uploaded batch's base offset (max_bytes 1, 5000, 30000; 1 MiB for every tenth)
    and an offset inside each multi-record batch (max_bytes 1, 30000), read_blocking returns
    exactly the local read's bytes trimmed to whole batches: the batch holding the offset first
    and whole (also past max_bytes: KIP-74), then the whole batches that fit, never past the
    segment, never a cut batch. With 64 KiB chunks batches straddle chunk boundaries (one spans
    two), with 4 MiB chunks a segment is one chunk."""
    reader = make_reader(store, chunk_bytes=chunk_bytes)
    for (offset, max_bytes), local in tiered.local_reads.items():
        remote = reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, max_bytes)
        want = whole_batches(local)
        base, next_offset, size = batch_at(tiered, offset)
        assert local.startswith(remote), (offset, max_bytes)
        assert remote == want, (offset, max_bytes, len(remote), len(want))
        first = record.read_header(remote)
        assert (first.base_offset, first.size) == (base, size)  # the batch holding the offset, whole
        assert len(remote) == size or len(remote) <= max_bytes


def test_reads_outside_the_remote_log_answer_nothing(tiered, store, make_reader):
    """At or past the remote log end (the local log's part) and below the manifest's log start,
    read_blocking and read answer b"" (the caller reads locally or answers out of range)."""
    reader = make_reader(store)
    end = tiered.manifest.log_end_offset
    assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, end, 1 << 20) == b""
    assert reader.read(TOPIC, PARTITION, tiered.manifest, end + 5, 1 << 20) == b""
    start = tiered.batches[3][0] + 1
    moved = tiered.manifest.with_log_start_offset(start)
    assert reader.read_blocking(TOPIC, PARTITION, moved, start - 1, 1 << 20) == b""
    assert reader.read_blocking(TOPIC, PARTITION, moved, start, 1) == expected(tiered, tiered.batches[3][0], 1)


# --- 2. the non-blocking path ------------------------------------------------------------------

def test_read_hands_a_miss_to_a_worker_and_the_retry_claims_its_answer(tiered, store, make_reader):
    """A cold `read` raises RemoteReadPending at once; on_ready fires exactly once with (topic,
    partition); the retry returns what read_blocking returns (the local bytes). With the segment
    in one cached chunk, a read of another offset of that segment then returns on the loop: no
    ranged GET and no worker read."""
    counter = RangeCounter(store)
    ready = Ready()
    reader = make_reader(store, chunk_bytes=1 << 20, prefetch_chunks=0, on_ready=ready)
    offset = tiered.batches[5][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 30_000)
    ready.wait()
    settle(reader)
    assert ready.calls == [(TOPIC, PARTITION)]
    assert reader.worker_reads == 1
    answer = reader.read(TOPIC, PARTITION, tiered.manifest, offset, 30_000)
    assert answer == expected(tiered, offset, 30_000)
    assert answer == reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, 30_000)
    gets = len(counter)
    assert gets == 1  # the segment's one chunk
    for base, _, _ in tiered.batches[20:40]:
        assert reader.read(TOPIC, PARTITION, tiered.manifest, base, 5_000) == expected(tiered, base, 5_000)
    assert len(counter) == gets and reader.worker_reads == 1 and len(ready.calls) == 1


def test_read_with_no_manifest_yet_has_the_worker_load_it(tiered, store, make_reader):
    """manifest=None (the manager has not read it yet): the worker loads the manifest and answers."""
    ready = Ready()
    reader = make_reader(store, on_ready=ready)
    offset = tiered.batches[-1][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, None, offset, 5_000)
    ready.wait()
    assert reader.read(TOPIC, PARTITION, None, offset, 5_000) == expected(tiered, offset, 5_000)


def test_two_identical_pending_reads_share_one_worker_read(tiered, store, make_reader):
    """Two fetches of the same offset while the first one's worker is still reading: both raise
    RemoteReadPending, one worker read runs, on_ready fires once, and both retries get the bytes
    (the first claims the answer, the second finds the chunks cached)."""
    counter = RangeCounter(store)
    counter.gate.clear()
    ready = Ready()
    reader = make_reader(store, prefetch_chunks=0, on_ready=ready)
    offset = tiered.batches[7][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    assert counter.entered.wait(WAIT_S)  # the worker is inside the ranged GET
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    counter.gate.set()
    ready.wait()
    settle(reader)
    assert reader.worker_reads == 1 and ready.calls == [(TOPIC, PARTITION)]
    want = expected(tiered, offset, 5_000)
    assert reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000) == want
    assert reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000) == want
    assert reader.worker_reads == 1 and len(counter) == 1


def test_a_retry_with_a_smaller_max_bytes_gets_no_more_than_it_asked(tiered, store, make_reader):
    """Two fetches of one offset with different max_bytes (two consumers, or one fetch whose
    budget shrank between its first pass and its retry): the answer the retry claims respects the
    retry's max_bytes (`read`'s docstring: the first batch whole, then what fits), as
    read_blocking with that max_bytes does."""
    ready = Ready()
    reader = make_reader(store, prefetch_chunks=0, on_ready=ready)
    offset = tiered.batches[2][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 1 << 20)
    ready.wait()
    answer = reader.read(TOPIC, PARTITION, tiered.manifest, offset, 1)
    assert answer == expected(tiered, offset, 1), (len(answer), len(expected(tiered, offset, 1)))


def test_a_read_whose_bytes_are_cached_never_waits_for_the_next_chunk(tiered, store, make_reader):
    """Chunk 0 of a segment cached (by a read of offset 0), nothing else of the .log: a `read` of
    a batch lying wholly in chunk 0, with the batch after it, needs no other byte, so it returns
    on the loop with no ranged GET (the module docstring: only a `.log` byte the cache lacks
    makes a read pending; a read whose chunks are cached costs no thread hop)."""
    segment = tiered.manifest.segments[0]
    positions = batch_positions(store, segment)
    counter = RangeCounter(store)
    reader = make_reader(store, chunk_bytes=CHUNK, prefetch_chunks=0)
    first = reader.read_blocking(TOPIC, PARTITION, tiered.manifest, 0, 1)
    assert first == expected(tiered, 0, 1)
    assert chunk_key(segment, 0) in reader.cache and chunk_key(segment, 1) not in reader.cache
    gets = len(counter)
    # The last batch that, with the one after it, ends inside chunk 0.
    inside = [h.base_offset for (p, h), (q, after) in zip(positions, positions[1:]) if q + after.size <= CHUNK]
    offset = inside[-1]
    try:
        data = reader.read(TOPIC, PARTITION, tiered.manifest, offset, 1)
    except RemoteReadPending:
        pytest.fail(f"read of offset {offset} (bytes all in cached chunk 0) went to a worker; "
                    f"ranged GETs: {counter.calls[gets:]}")
    assert data == expected(tiered, offset, 1)
    assert len(counter) == gets


# --- 3. errors reach the retry -----------------------------------------------------------------

def test_a_flipped_byte_in_a_remote_batch_answers_corrupt_message_never_its_bytes(tiered, own_store, make_reader):
    """A byte flipped inside a batch body of a remote `.log`: the retry of a read from that batch
    raises CorruptMessageError (as read_blocking does); a read from an earlier batch of the
    segment returns the intact batches before the bad one and stops there (bad bytes are never
    returned)."""
    segment = own_store.load_manifest(TOPIC, PARTITION).segments[1]
    positions = batch_positions(own_store, segment)
    position, bad = positions[10]
    path = Path(own_store.object_path(TOPIC, PARTITION, segment.log))
    data = bytearray(path.read_bytes())
    data[position + record.HEADER_SIZE + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    ready = Ready()
    reader = make_reader(own_store, on_ready=ready)
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, bad.base_offset, 1 << 20)
    ready.wait()
    with pytest.raises(CorruptMessageError):
        reader.read(TOPIC, PARTITION, tiered.manifest, bad.base_offset, 1 << 20)
    assert reader.read_errors == 1
    with pytest.raises(CorruptMessageError):
        reader.read_blocking(TOPIC, PARTITION, tiered.manifest, bad.last_offset, 1)
    before = positions[5][1].base_offset
    intact = reader.read_blocking(TOPIC, PARTITION, tiered.manifest, before, 1 << 20)
    assert intact == bytes(data[positions[5][0]:position])
    assert intact == expected(tiered, before, 30_000)[:len(intact)]


def test_a_deleted_remote_object_answers_remote_storage_error_and_is_not_remembered(tiered, own_store, make_reader):
    """The `.log` of a segment gone from the store (retention raced the read): the retry raises
    RemoteObjectNotFoundError, a RemoteStorageError (retriable). Once the object is back, a new
    read succeeds: the error was an answer for one retry, not a cached state."""
    segment = own_store.load_manifest(TOPIC, PARTITION).segments[2]
    path = Path(own_store.object_path(TOPIC, PARTITION, segment.log))
    saved = path.read_bytes()
    path.unlink()
    ready = Ready()
    reader = make_reader(own_store, on_ready=ready)
    offset = [b for b, _, _ in tiered.batches if b > segment.base_offset][3]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    ready.wait()
    with pytest.raises(RemoteObjectNotFoundError) as raised:
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    assert isinstance(raised.value, RemoteStorageError)
    path.write_bytes(saved)
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 1)
    ready.wait()
    assert reader.read(TOPIC, PARTITION, tiered.manifest, offset, 1) == expected(tiered, offset, 1)


# --- 4. bad indexes only cost a scan -----------------------------------------------------------

def test_an_index_object_failing_its_crc_is_done_without(tiered, own_store, make_reader):
    """An entry of a remote `.index` overwritten to point at another batch: its CRC32C no longer
    matches the manifest's, the reader caches "no indexes" for the segment, and every read of the
    segment still returns the local bytes (a scan from the segment's start)."""
    segment = own_store.load_manifest(TOPIC, PARTITION).segments[1]
    path = Path(own_store.object_path(TOPIC, PARTITION, segment.index))
    data = bytearray(path.read_bytes())
    assert len(data) >= 16 + 3 * 8
    positions = batch_positions(own_store, segment)
    data[16 + 8 + 4:16 + 8 + 8] = positions[1][0].to_bytes(4, "little")  # entry 1 -> batch 1's position
    path.write_bytes(bytes(data))
    reader = make_reader(own_store)
    bases = [b for b, _, _ in tiered.batches if segment.base_offset <= b < segment.next_offset]
    for base in bases:
        assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, base, 5_000) == expected(tiered, base, 5_000)
    found, indexes = reader.cache.get(reader._indexes_key(TOPIC, PARTITION, segment))
    assert found and indexes == (None, None)


def _bad_index(tiered: Tiered, store: RemoteSegmentStore, segment: RemoteSegment,
               into_batch: bool) -> tuple[SparseIndex, int]:
    """An offset index as the store would hand one over (CRC fine, entries sane) whose last entry
    names batch i's offset but points at batch i+3 (or, `into_batch`, 7 bytes into batch i);
    returns it and that offset. Batch i is the one a time-index entry near the middle of the
    segment names, so offset_for_timestamp of its first record's time goes through the entry."""
    positions = batch_positions(store, segment)
    time_index = store.read_time_index(TOPIC, PARTITION, segment)
    target = time_index.offset_for_time(tiered.timestamps[positions[len(positions) // 2][1].base_offset])
    i = next(n for n, (_, h) in enumerate(positions) if h.base_offset == target)
    assert i > 5
    wrong = positions[i][0] + 7 if into_batch else positions[i + 3][0]
    index = SparseIndex(OFFSET_INDEX, Path(segment.index.name), segment.base_offset)
    for p, h in positions[1 : i - 1 : 5]:
        index.append(h.base_offset, p)
    index.append(target, wrong)
    index.sanity_check(segment.size_bytes)
    return index, target


def _install(reader: RemoteLogReader, store: RemoteSegmentStore, segment: RemoteSegment, index: SparseIndex) -> None:
    """Cache `index` (with the segment's real time index) as if it had been loaded."""
    time_index = store.read_time_index(TOPIC, PARTITION, segment)
    reader.cache.put(reader._indexes_key(TOPIC, PARTITION, segment), (index, time_index), 1)


@pytest.mark.parametrize("into_batch", [False, True], ids=["wrong-batch", "inside-a-batch"])
def test_an_index_entry_pointing_at_the_wrong_place_only_costs_a_scan(tiered, store, make_reader, into_batch):
    """An offset index whose CRC matched (so it was cached) but whose entry for batch i points at
    another batch (or into the middle of batch i): reads of batch i and those after it, on the
    loop and blocking, still return the local bytes (the reader drops the index and scans), as
    `read_batches` of the store does for its CorruptIndexError. The `.log` itself is intact, so a
    consumer must not be stuck on CORRUPT_MESSAGE at that offset."""
    segment = tiered.manifest.segments[2]
    index, target = _bad_index(tiered, store, segment, into_batch)
    ready = Ready()
    reader = make_reader(store, on_ready=ready)
    _install(reader, store, segment, index)
    try:
        data = reader.read(TOPIC, PARTITION, tiered.manifest, target, 5_000)
    except RemoteReadPending:
        ready.wait()
        data = reader.read(TOPIC, PARTITION, tiered.manifest, target, 5_000)
    assert data == expected(tiered, target, 5_000)
    later = [b for b, _, _ in tiered.batches if target <= b < segment.next_offset][:15]
    for base in later:
        assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, base, 1) == expected(tiered, base, 1)


def test_offset_for_timestamp_survives_an_index_entry_pointing_at_the_wrong_batch(tiered, store, make_reader):
    """offset_for_timestamp whose time-index floor entry leads through an offset-index entry that
    points at the wrong batch (CRC fine, so cached) still finds the first record at or after the
    time, as a read through that index does (test above), instead of failing the ListOffsets."""
    segment = tiered.manifest.segments[2]
    index, target = _bad_index(tiered, store, segment, into_batch=False)
    reader = make_reader(store)
    _install(reader, store, segment, index)
    # The time-index entry naming batch `target` holds its max timestamp, its last record's.
    t = tiered.timestamps[batch_at(tiered, target)[1] - 1]
    assert store.read_time_index(TOPIC, PARTITION, segment).offset_for_time(t) == target
    assert reader.offset_for_timestamp(TOPIC, PARTITION, tiered.manifest, t).result(WAIT_S) == _brute_force(tiered, t)


# --- 5. prefetch -------------------------------------------------------------------------------

def test_a_read_near_a_segments_start_prefetches_the_next_chunk(tiered, store, make_reader):
    """prefetch_chunks=1, 64 KiB chunks: a read of offset 0 with max_bytes 1 loads chunk 0 (one
    ranged GET); chunk 1 then arrives in the cache with no further call from the test, through
    one more ranged GET; chunk 2 is not loaded."""
    counter = RangeCounter(store)
    reader = make_reader(store, chunk_bytes=CHUNK, prefetch_chunks=1)
    segment = tiered.manifest.segments[0]
    assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, 0, 1) == expected(tiered, 0, 1)
    wait_until(lambda: chunk_key(segment, 1) in reader.cache, WAIT_S, "the next chunk cached", 0.005)
    settle(reader)
    assert chunk_key(segment, 2) not in reader.cache
    assert counter.calls == [(0, 0, CHUNK), (0, CHUNK, CHUNK)]


def test_a_read_ending_a_segment_prefetches_the_next_segments_start(tiered, store, make_reader):
    """A read that returns a segment's last batch prefetches the next segment's indexes and its
    chunk 0, so a sequential consumer crossing the boundary finds them cached."""
    reader = make_reader(store, chunk_bytes=CHUNK, prefetch_chunks=1)
    segment, following = tiered.manifest.segments[1], tiered.manifest.segments[2]
    last = [b for b, n, _ in tiered.batches if n == segment.next_offset][0]
    assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, last, 1 << 20) == expected(tiered, last, 1)
    wait_until(lambda: chunk_key(following, 0) in reader.cache
               and reader._indexes_key(TOPIC, PARTITION, following) in reader.cache,
               WAIT_S, "the following segment's first chunk and indexes cached", 0.005)
    found, (offset_index, time_index) = reader.cache.get(reader._indexes_key(TOPIC, PARTITION, following))
    assert offset_index is not None and time_index is not None


def test_prefetch_chunks_zero_loads_only_what_reads_need(tiered, store, make_reader):
    """prefetch_chunks=0: after reads at a segment's start and end, nothing arrives in the cache
    beyond what those reads loaded themselves (no ranged GET after they returned)."""
    counter = RangeCounter(store)
    reader = make_reader(store, chunk_bytes=CHUNK, prefetch_chunks=0)
    segment, following = tiered.manifest.segments[0], tiered.manifest.segments[1]
    reader.read_blocking(TOPIC, PARTITION, tiered.manifest, 0, 1)
    last = [b for b, n, _ in tiered.batches if n == segment.next_offset][0]
    reader.read_blocking(TOPIC, PARTITION, tiered.manifest, last, 1 << 20)
    gets, entries = len(counter), len(reader.cache)
    settle(reader)
    assert len(counter) == gets and len(reader.cache) == entries
    assert chunk_key(segment, 1) not in reader.cache
    assert chunk_key(following, 0) not in reader.cache
    assert reader._indexes_key(TOPIC, PARTITION, following) not in reader.cache


# --- 6. the LRU bound --------------------------------------------------------------------------

def _read_everything(reader: RemoteLogReader, tiered: Tiered, max_bytes: int, check: Callable[[], None]) -> bytes:
    """Read the remote log front to back with read_blocking; `check` after every read."""
    out, offset = [], 0
    while offset < tiered.manifest.log_end_offset:
        data = reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, max_bytes)
        assert data
        out.append(data)
        *_, (_, last) = record.iter_batches(data, verify=False)
        offset = last.next_offset
        check()
    return b"".join(out)


def test_a_small_cache_stays_within_its_bytes_while_the_whole_log_is_read(tiered, store, make_reader):
    """A 200 KiB cache of 64 KiB chunks: reading the whole remote log (about a MiB) keeps
    size_bytes <= capacity after every read, evicts, and still returns every batch exactly."""
    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=200 * KIB, prefetch_chunks=0)
    sizes = []

    def check() -> None:
        sizes.append(reader.cache.size_bytes)
        assert reader.cache.size_bytes <= reader.cache.capacity_bytes

    everything = _read_everything(reader, tiered, 16_000, check)
    assert [h.base_offset for _, h in record.iter_batches(everything)] == [b for b, _, _ in tiered.batches]
    assert reader.cache.evictions > 0 and max(sizes) > 100 * KIB


def test_with_prefetch_the_cache_bound_holds_under_concurrent_puts(tiered, store, make_reader):
    """prefetch_chunks=2 puts chunks from workers while the test reads: the bound still holds
    (checked under the cache's lock, where puts finish their evictions)."""
    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=256 * KIB, prefetch_chunks=2)

    def check() -> None:
        with reader.cache._lock:
            assert reader.cache.size_bytes <= reader.cache.capacity_bytes

    _read_everything(reader, tiered, 50_000, check)
    settle(reader)
    check()
    assert reader.cache.evictions > 0


def test_a_cache_smaller_than_a_chunk_still_answers(tiered, store, make_reader):
    """cache_bytes below chunk_bytes: no chunk is ever kept, yet read_blocking answers, and so
    does the non-blocking read's retry (the worker's answer carries the bytes)."""
    ready = Ready()
    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=16 * KIB, prefetch_chunks=0, on_ready=ready)
    offset = tiered.batches[40][0]
    assert reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, 5_000) == expected(tiered, offset, 5_000)
    assert not any(isinstance(key[-1], int) for key in reader.cache._entries)
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    ready.wait()
    assert reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000) == expected(tiered, offset, 5_000)


def test_a_fetch_loop_on_a_small_cache_ends_with_its_answer(tiered, store, make_reader):
    """The broker's loop (read; on RemoteReadPending wait for on_ready, then read again) gets its
    answer within a few rounds also when the answer (about 150 KiB) is larger than the reader
    keeps unclaimed answers (max(cache/4, chunk) = 64 KiB here) and the cache (128 KiB of 64 KiB
    chunks) cannot hold every chunk the read needed, so the retry cannot be served from it
    either. 128 KiB is below the broker's 1 MiB minimum; the arithmetic is the same at that
    minimum for a 1 MiB fetch of a segment of a MiB or more."""
    ready = Ready()
    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=128 * KIB, prefetch_chunks=0, on_ready=ready)
    offset = 0
    rounds = 0
    while True:
        try:
            data = reader.read(TOPIC, PARTITION, tiered.manifest, offset, 150_000)
            break
        except RemoteReadPending:
            rounds += 1
            assert rounds <= 5, f"still pending after {rounds - 1} worker answers (worker reads: {reader.worker_reads})"
            ready.wait()
    assert data == reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, 150_000)
    assert len(data) > 100 * KIB


def test_chunk_cache_is_an_lru_bounded_in_bytes():
    """get makes an entry the most recently used (so it outlives an older one); put of an existing
    key replaces its value and size; puts beyond capacity evict least recently used first and
    count evictions; a value larger than the capacity is not kept; hits and misses are counted."""
    cache = ChunkCache(100)
    cache.put("a", b"A", 40)
    cache.put("b", b"B", 40)
    assert cache.get("a") == (True, b"A")  # a is now more recent than b
    cache.put("c", b"C", 40)  # 120 > 100: b goes
    assert "b" not in cache and "a" in cache and "c" in cache
    assert (cache.size_bytes, cache.evictions, len(cache)) == (80, 1, 2)
    cache.put("a", b"A2", 10)
    assert cache.get("a") == (True, b"A2") and cache.size_bytes == 50
    cache.put("big", b"X", 101)
    assert "big" not in cache and cache.size_bytes == 50 and cache.evictions == 1
    cache.put("d", b"D", 50)  # exactly full: nothing evicted
    assert cache.size_bytes == 100 and cache.evictions == 1
    cache.put("e", b"E", 1)  # 101: c, the least recently used, goes (61 then fits)
    assert "c" not in cache and all(key in cache for key in ("a", "d", "e"))
    assert cache.size_bytes == 61 and cache.evictions == 2
    assert cache.get("zzz") == (False, None)
    assert (cache.hits, cache.misses) == (2, 1)


# --- 7. offset_for_timestamp -------------------------------------------------------------------

def _brute_force(tiered: Tiered, timestamp_ms: int, start: int = 0) -> tuple[int, int] | None:
    """The first remote record at or after `start` with a timestamp >= `timestamp_ms`."""
    for offset in range(start, tiered.manifest.log_end_offset):
        if tiered.timestamps[offset] >= timestamp_ms:
            return offset, tiered.timestamps[offset]
    return None


def test_offset_for_timestamp_finds_the_first_record_at_or_after_a_time(tiered, store, make_reader):
    """For the first record of every segment (its timestamp, and one ms later: the next record,
    found by decoding a body), before every record, and at the last remote record, the future's
    result is the brute-force answer over every record, and the local log's answer before
    deletion."""
    reader = make_reader(store, chunk_bytes=CHUNK)
    times = sorted(t for t in tiered.local_offset_for_timestamp if t <= tiered.timestamps[tiered.manifest.log_end_offset - 1])
    futures = {t: reader.offset_for_timestamp(TOPIC, PARTITION, tiered.manifest, t) for t in times}
    for t, future in futures.items():
        found = future.result(WAIT_S)
        assert found == _brute_force(tiered, t), t
        assert found == tiered.local_offset_for_timestamp[t], t
    assert futures[FIRST_TIMESTAMP - 1].result() == (0, FIRST_TIMESTAMP)


def test_offset_for_timestamp_past_every_remote_record_is_none(tiered, store, make_reader):
    """A time after the last remote record's: None (the local log holds later records; the
    remote tier answers for its own only)."""
    reader = make_reader(store)
    t = tiered.timestamps[tiered.manifest.log_end_offset - 1] + 1
    assert tiered.local_offset_for_timestamp[t] is not None  # the local part has one
    assert reader.offset_for_timestamp(TOPIC, PARTITION, tiered.manifest, t).result(WAIT_S) is None
    assert reader.offset_for_timestamp(TOPIC, PARTITION, tiered.manifest, 10**15).result(WAIT_S) is None


def test_offset_for_timestamp_never_answers_below_the_log_start(tiered, store, make_reader):
    """With the manifest's log start inside the first segment (records below it deleted), a time
    older than every record answers the first record at the log start, with that record's
    timestamp; a time within the deleted records answers the same; later times are unaffected."""
    reader = make_reader(store)
    start = tiered.batches[5][0] + 1  # inside a batch
    moved = tiered.manifest.with_log_start_offset(start)
    assert moved.segments == tiered.manifest.segments
    for t in (FIRST_TIMESTAMP - 1, FIRST_TIMESTAMP, tiered.timestamps[start - 1], tiered.timestamps[start]):
        found = reader.offset_for_timestamp(TOPIC, PARTITION, moved, t).result(WAIT_S)
        assert found == _brute_force(tiered, t, start) == (start, tiered.timestamps[start]), t
    later = tiered.timestamps[start + 100]
    assert reader.offset_for_timestamp(TOPIC, PARTITION, moved, later).result(WAIT_S) == (start + 100, later)


# --- 8. concurrency ----------------------------------------------------------------------------

def test_concurrent_blocking_reads_on_a_small_cache_all_answer_exactly(tiered, store, make_reader):
    """8 threads, 80 read_blocking calls each at random (offset, max_bytes) pairs, on a 256 KiB
    cache of 64 KiB chunks with prefetch (loads, evictions and prefetches racing): every answer
    equals the local bytes."""
    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=256 * KIB, prefetch_chunks=1, threads=4)
    keys = sorted(tiered.local_reads)
    barrier = threading.Barrier(8)
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(80):
            offset, max_bytes = rng.choice(keys)
            try:
                data = reader.read_blocking(TOPIC, PARTITION, tiered.manifest, offset, max_bytes)
            except Exception as err:  # noqa: BLE001 - reported below
                failures.append(f"{offset}/{max_bytes}: {type(err).__name__}: {err}")
                continue
            if data != expected(tiered, offset, max_bytes):
                failures.append(f"{offset}/{max_bytes}: {len(data)} bytes differ")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert reader.cache.evictions > 0


def test_concurrent_loop_reads_all_get_their_answers(tiered, store, make_reader):
    """8 threads acting as fetches (read; on RemoteReadPending wait for the partition's on_ready,
    read again) on random offsets of a small cache, answers claimed by whichever fetch retries
    first: each gets exactly the local bytes. Every offset is always read with the same max_bytes
    (mixed sizes are test_a_retry_with_a_smaller_max_bytes_gets_no_more_than_it_asked's)."""
    condition = threading.Condition()
    wakeups = [0]

    def on_ready(key: tuple[str, int]) -> None:
        with condition:
            wakeups[0] += 1
            condition.notify_all()

    reader = make_reader(store, chunk_bytes=CHUNK, cache_bytes=512 * KIB, prefetch_chunks=1, threads=4, on_ready=on_ready)
    keys = sorted((offset, max_bytes) for offset, max_bytes in tiered.local_reads
                  if max_bytes == (1 if offset % 2 else 30_000))
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            offset, max_bytes = rng.choice(keys)
            for _ in range(50):
                with condition:
                    seen = wakeups[0]
                try:
                    data = reader.read(TOPIC, PARTITION, tiered.manifest, offset, max_bytes)
                    break
                except RemoteReadPending:
                    with condition:
                        condition.wait_for(lambda: wakeups[0] != seen, timeout=0.2)
            else:
                failures.append(f"{offset}/{max_bytes}: never answered")
                continue
            if data != expected(tiered, offset, max_bytes):
                failures.append(f"{offset}/{max_bytes}: {len(data)} bytes, expected {len(expected(tiered, offset, max_bytes))}")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(100, 108)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []


# --- 9. close ----------------------------------------------------------------------------------

def test_close_drops_the_answers_of_reads_in_progress(tiered, store, make_reader):
    """A worker read still inside its ranged GET when close() is called finishes, but its answer
    is dropped: no on_ready, nothing kept; a `read` after close returns or raises at once (it
    never blocks and starts no worker)."""
    counter = RangeCounter(store)
    counter.gate.clear()
    ready = Ready()
    reader = make_reader(store, prefetch_chunks=0, on_ready=ready)
    offset = tiered.batches[12][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, offset, 5_000)
    assert counter.entered.wait(WAIT_S)
    closer = threading.Thread(target=reader.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # waiting for the read in progress
    counter.gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert ready.calls == [] and not reader._answers
    other = tiered.batches[-1][0]
    started = time.monotonic()
    for target in (offset, other):
        try:
            data = reader.read(TOPIC, PARTITION, tiered.manifest, target, 5_000)
            assert data == expected(tiered, target, 5_000)
        except RemoteReadPending:
            pass
    assert time.monotonic() - started < 1.0
    assert reader.worker_reads == 1 and not reader._pending
    settle(reader)
    assert ready.calls == []


def test_reads_past_max_pending_tasks_answer_work_queue_full(tiered, store, make_reader):
    """One thread, no queue: while a worker read hangs on the store, a second cold read is refused
    with the retriable WorkQueueFullError (not queued without bound) and not left pending: once
    the worker is free the same read is answered."""
    counter = RangeCounter(store)
    counter.gate.clear()
    ready = Ready()
    reader = make_reader(store, chunk_bytes=64 << 10, prefetch_chunks=1, threads=1, max_pending_tasks=0, on_ready=ready)
    first, second = tiered.batches[5][0], tiered.batches[25][0]
    with pytest.raises(RemoteReadPending):
        reader.read(TOPIC, PARTITION, tiered.manifest, first, 30_000)
    assert counter.entered.wait(WAIT_S)
    with pytest.raises(WorkQueueFullError) as refused:
        reader.read(TOPIC, PARTITION, tiered.manifest, second, 5_000)
    assert refused.value.retriable and reader._executor.rejected >= 1
    counter.gate.set()
    ready.wait()
    assert reader.read(TOPIC, PARTITION, tiered.manifest, first, 30_000) == expected(tiered, first, 30_000)
    wait_until(lambda: reader._executor.depth == 0, WAIT_S, "the read-ahead it could submit finished", 0.005)
    try:
        answer = reader.read(TOPIC, PARTITION, tiered.manifest, second, 5_000)
    except RemoteReadPending:
        ready.wait()
        answer = reader.read(TOPIC, PARTITION, tiered.manifest, second, 5_000)
    assert answer == expected(tiered, second, 5_000)
