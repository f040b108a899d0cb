"""RemoteLogReader: serves reads below the local log start from the remote tier (Kafka's
RemoteLogReader and remote index cache; docs/architecture.md, Tiered storage).

A consumer fetching an offset whose local segment local retention deleted is answered from the
remote segment's objects as if they were local: the same whole, CRC-checked batches, the first
one whole however large (KIP-74). The client cannot tell where the bytes came from.

Remote reads are network round trips, and the event loop must never wait for one. So every read
first runs on the loop against the cache alone (`read`): a `.log` byte the cache lacks makes it
raise RemoteReadPending after handing the same read to a worker thread, which loads what is
missing and keeps its answer (bytes or the error) for the retry. The worker then calls
`on_ready((topic, partition))`, which the broker turns into a wake-up of the fetches parked on
that partition: the retry finds the answer. No thread ever blocks the loop, and a read whose
chunks are cached costs no thread hop at all.

The cache (`ChunkCache`) holds fixed-size chunks of `.log` objects and parsed offset/time indexes,
bounded in bytes and evicted least-recently-used. Keys name the upload (`upload_id`), and an
upload's objects never change, so an entry is never stale: retention that deletes a segment only
leaves its entries to age out. Sequential readers find their next chunk loaded ahead of them:
each read prefetches the `prefetch_chunks` chunks after the byte it ended at (and, at a segment's
end, the next segment's index and first chunk).

Errors: RemoteStorageError (KAFKA_STORAGE_ERROR, retriable) when the store fails or an object is
gone (retention raced the read: the retry finds the offset out of range), CorruptMessageError
(CORRUPT_MESSAGE) for bytes that fail their checks; bad bytes are never returned.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from typing import Any

from broker.executors import BoundedExecutor
from broker.remote_log.remote_read_pending import RemoteReadPending
from common.errors import PymqError, UnknownServerError, WorkQueueFullError
from common.topic_partition import TopicPartition
from segment_format import record
from segment_format.index_file import CorruptIndexError, SparseIndex
from segment_format.manifest import PartitionManifest, RemoteSegment
from segment_format.segment_reader import SegmentReader
from tiered_storage import RemoteSegmentStore
from tiered_storage.remote_store import offset_for_timestamp, validated_range

log = logging.getLogger(__name__)

# Unclaimed answers of worker reads kept for their retries (a fetch that went away never claims
# one), at most this many and a quarter of the cache's bytes, the oldest dropped first: a retry
# that finds none reads the cache again.
MAX_UNCLAIMED_ANSWERS = 1024


class _CacheMiss(Exception):
    """Raised inside a loop-side read at the first missing chunk or index (never escapes)."""


class ChunkCache:
    """A thread-safe LRU of immutable values bounded by their total size in bytes. A value larger
    than the whole capacity is still handed to its loader but not kept."""

    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes > 0, capacity_bytes
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.size_bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: Hashable) -> tuple[bool, Any]:
        """(True, value) and the entry becomes the most recently used, or (False, None)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return False, None
            self._entries.move_to_end(key)
            self.hits += 1
            return True, entry[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size_bytes -= old[1]
            self._entries[key] = (value, size)
            self.size_bytes += size
            while self.size_bytes > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.size_bytes -= evicted
                self.evictions += 1


class RemoteLogReader:
    """Reads below the local log start for one broker. `read` and `offset_for_timestamp` are
    called on the event loop and never block; the work that does runs in `threads` workers, with
    at most `max_pending_tasks` reads queued for them (past that a read raises
    WorkQueueFullError, retriable, and read-ahead is skipped)."""

    def __init__(self, store: RemoteSegmentStore, *, cache_bytes: int = 256 << 20, chunk_bytes: int = 4 << 20,
                 prefetch_chunks: int = 1, threads: int = 4, max_pending_tasks: int = 100,
                 on_ready: Callable[[TopicPartition], None] = lambda key: None) -> None:
        assert chunk_bytes > 0 and prefetch_chunks >= 0 and threads >= 1, (chunk_bytes, prefetch_chunks, threads)
        self.store = store
        self.chunk_bytes = chunk_bytes
        self.prefetch_chunks = prefetch_chunks
        self.cache = ChunkCache(cache_bytes)
        self._on_ready = on_ready  # called from a worker thread
        self._executor = BoundedExecutor("remote-read", threads, max_pending_tasks)
        self._lock = threading.Lock()
        self._pending: set[tuple[str, int, int]] = set()  # reads a worker runs
        self._answers: OrderedDict[tuple[str, int, int], tuple[bytes, PymqError | None]] = OrderedDict()
        self._answers_bytes = 0
        self._max_answers_bytes = max(cache_bytes // 4, chunk_bytes)
        self._loading: dict[Hashable, Future[Any]] = {}  # chunks and indexes being loaded
        self._closed = False
        self.worker_reads = self.read_errors = 0  # metrics

    def close(self) -> None:
        """Stop the workers (reads in progress finish; their answers are dropped)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(cancel_queued=True)

    # --- fetch -------------------------------------------------------------------------------

    def read(self, topic: str, partition: int, manifest: PartitionManifest | None, offset: int, max_bytes: int) -> bytes:
        """The batches from the one holding `offset` (the first whole, then what fits in
        `max_bytes`), from the remote segments of `manifest` (None: not read yet: a worker reads
        it). b"" when the remote log ends before `offset` (the caller reads locally).
        RemoteReadPending while a worker loads what the cache lacks; WorkQueueFullError when the
        workers' queue is full; the error of a worker's read as raised by it (PymqError) on the
        retry that claims it."""
        key = (topic, partition, offset)
        with self._lock:
            answer = self._answers.pop(key, None)
            if answer is not None:
                self._answers_bytes -= len(answer[0])
        if answer is not None:
            data, error = answer
            if error is not None:
                raise error
            return _first_batches(data, max_bytes)  # a worker may have read for a larger fetch
        if manifest is not None:
            try:
                return self._read(topic, partition, manifest, offset, max_bytes, blocking=False)
            except _CacheMiss:
                pass
        self._submit_read(key, manifest, max_bytes)
        raise RemoteReadPending(f"{topic}-{partition}: offset {offset} is being read from the remote store")

    def read_blocking(self, topic: str, partition: int, manifest: PartitionManifest, offset: int, max_bytes: int) -> bytes:
        """`read` on the caller's thread, loading what the cache lacks (workers and tools)."""
        return self._read(topic, partition, manifest, offset, max_bytes, blocking=True)

    def _submit_read(self, key: tuple[str, int, int], manifest: PartitionManifest | None, max_bytes: int) -> None:
        with self._lock:
            if key in self._pending or self._closed:
                return
            self._pending.add(key)
        try:
            self._executor.submit(self._worker_read, key, manifest, max_bytes)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._pending.discard(key)
        except WorkQueueFullError:  # the fetch answers this retriable error for the partition
            with self._lock:
                self._pending.discard(key)
            raise

    def _worker_read(self, key: tuple[str, int, int], manifest: PartitionManifest | None, max_bytes: int) -> None:
        topic, partition, offset = key
        data, error = b"", None
        try:
            if manifest is None:
                manifest = self.store.load_manifest(topic, partition)
            data = self._read(topic, partition, manifest, offset, max_bytes, blocking=True)
        except PymqError as err:  # RemoteStorageError, CorruptMessageError: the retry answers with it
            error = err
        except Exception as err:  # a bug: the retry answers UNKNOWN_SERVER_ERROR
            log.exception("remote read of %s-%d at offset %d failed", topic, partition, offset)
            error = UnknownServerError(f"{type(err).__name__}: {err}")
        with self._lock:
            self.worker_reads += 1
            self.read_errors += error is not None
            self._pending.discard(key)
            if self._closed:
                return
            old = self._answers.pop(key, None)
            self._answers_bytes += len(data) - (len(old[0]) if old is not None else 0)
            self._answers[key] = (data, error)
            # Never the one just stored: its retry must find it even if the cache could not keep its chunks.
            while len(self._answers) > 1 and (len(self._answers) > MAX_UNCLAIMED_ANSWERS
                                              or self._answers_bytes > self._max_answers_bytes):
                self._answers_bytes -= len(self._answers.popitem(last=False)[1][0])
        self._on_ready((topic, partition))

    def _read(self, topic: str, partition: int, manifest: PartitionManifest, offset: int, max_bytes: int,
              blocking: bool) -> bytes:
        """Segment after segment from the one holding `offset` until one has batches at or past it
        (a segment may end in a compaction gap)."""
        segment = manifest.segment_for_offset(offset)
        while segment is not None:
            position, data = self._without_bad_index(topic, partition, segment, lambda reader: validated_range(
                reader, offset, None, max_bytes), blocking)
            if data:
                self._prefetch(topic, partition, manifest, segment, position + len(data))
                return data
            segment = self._next_segment(manifest, segment)
        return b""

    def _without_bad_index(self, topic: str, partition: int, segment: RemoteSegment,
                           read: Callable[[SegmentReader], Any], blocking: bool = True) -> Any:
        """`read(reader)`; an index entry that points at the wrong place (CorruptIndexError) is
        logged, the segment's indexes are dropped for good, and the `.log` alone answers."""
        try:
            return read(self._reader(topic, partition, segment, blocking))
        except CorruptIndexError as err:
            log.warning("%s-%d: reading remote segment %s without its indexes: %s", topic, partition,
                        segment.log.name, err)
            self.cache.put(self._indexes_key(topic, partition, segment), (None, None), 0)
            return read(self._reader(topic, partition, segment, blocking))

    # --- ListOffsets -----------------------------------------------------------------------------

    def offset_for_timestamp(self, topic: str, partition: int, manifest: PartitionManifest,
                             timestamp_ms: int) -> Future[tuple[int, int] | None]:
        """(offset, timestamp) of the first remote record at or after `timestamp_ms`, or None,
        computed by a worker. Segments whose max timestamp (in the manifest) is older are skipped
        unread; records below the remote log start are not answered."""
        return self._executor.submit(offset_for_timestamp, manifest, timestamp_ms,
                                     functools.partial(self._without_bad_index, topic, partition))

    # --- cache -----------------------------------------------------------------------------------

    def _reader(self, topic: str, partition: int, segment: RemoteSegment, blocking: bool) -> SegmentReader:
        indexes = self._indexes(topic, partition, segment, blocking)
        chunk = self.chunk_bytes

        def pread(size: int, position: int) -> bytes:
            first, last = position // chunk, (position + size - 1) // chunk
            parts = [self._chunk(topic, partition, segment, k, blocking) for k in range(first, last + 1)]
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            start = position - first * chunk
            return data[start : start + size] if start or len(data) != size else data

        return SegmentReader(pread, segment.base_offset, size=segment.size_bytes,
                             name=f"{topic}/{partition}/{segment.log.name}",
                             offset_index=indexes[0], time_index=indexes[1], align=chunk)

    def _chunk(self, topic: str, partition: int, segment: RemoteSegment, k: int, blocking: bool) -> bytes:
        key = (topic, partition, segment.upload_id, k)
        return self._cached(key, blocking, lambda: self._load_chunk(topic, partition, segment, k))

    def _load_chunk(self, topic: str, partition: int, segment: RemoteSegment, k: int) -> tuple[bytes, int]:
        position = k * self.chunk_bytes
        data = self.store.read_range(topic, partition, segment, position,
                                     min(self.chunk_bytes, segment.size_bytes - position))
        return data, len(data)

    def _indexes(self, topic: str, partition: int, segment: RemoteSegment,
                 blocking: bool) -> tuple[SparseIndex | None, SparseIndex | None]:
        return self._cached(self._indexes_key(topic, partition, segment), blocking,
                            lambda: self._load_indexes(topic, partition, segment))

    @staticmethod
    def _indexes_key(topic: str, partition: int, segment: RemoteSegment) -> Hashable:
        return topic, partition, segment.upload_id, "indexes"

    def _load_indexes(self, topic: str, partition: int,
                      segment: RemoteSegment) -> tuple[tuple[SparseIndex | None, SparseIndex | None], int]:
        size = segment.index.size_bytes + segment.time_index.size_bytes
        try:
            return (self.store.read_offset_index(topic, partition, segment),
                    self.store.read_time_index(topic, partition, segment)), size
        except CorruptIndexError as err:
            # The `.log` alone still answers: its reads scan from the segment's start.
            log.warning("%s-%d: reading remote segment %s without its indexes: %s", topic, partition,
                        segment.log.name, err)
            return (None, None), 0

    def _cached(self, key: Hashable, blocking: bool, load: Callable[[], tuple[Any, int]]) -> Any:
        """The cached value of `key`; on a miss, _CacheMiss unless `blocking`, when this thread
        loads it (or waits for the worker already loading it: one load per key at a time)."""
        found, value = self.cache.get(key)
        if found:
            return value
        if not blocking:
            raise _CacheMiss()
        with self._lock:
            loading = self._loading.get(key)
            if loading is None:
                loading = self._loading[key] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return loading.result()
        try:
            value, size = load()
        except BaseException as err:
            with self._lock:
                del self._loading[key]
            loading.set_exception(err)
            raise
        self.cache.put(key, value, size)  # before the key leaves `_loading`: no second load
        with self._lock:
            del self._loading[key]
        loading.set_result(value)
        return value

    # --- prefetch ----------------------------------------------------------------------------------

    def _prefetch(self, topic: str, partition: int, manifest: PartitionManifest, segment: RemoteSegment,
                  end_position: int) -> None:
        """Load the chunks after byte `end_position` (where a sequential reader goes next) in the
        background, continuing into the next segment at this one's end."""
        for segment, k in self._chunks_after(manifest, segment, end_position):
            key = (topic, partition, segment.upload_id, k)
            if key in self.cache:
                continue
            with self._lock:
                if self._closed or key in self._loading:
                    continue
            try:
                self._executor.submit(self._prefetch_one, topic, partition, segment, k)
            except (RuntimeError, WorkQueueFullError):  # shut down, or busy: read-ahead is optional
                return

    def _chunks_after(self, manifest: PartitionManifest, segment: RemoteSegment,
                      end_position: int) -> Iterator[tuple[RemoteSegment, int]]:
        """The chunks holding the `prefetch_chunks` chunks' worth of bytes from `end_position` on."""
        position, remaining = end_position, self.prefetch_chunks * self.chunk_bytes
        while remaining > 0:
            if position >= segment.size_bytes:
                next_segment = self._next_segment(manifest, segment)
                if next_segment is None:
                    return
                segment, position = next_segment, 0
            k = position // self.chunk_bytes
            yield segment, k
            step = (k + 1) * self.chunk_bytes - position
            position += step
            remaining -= step

    def _prefetch_one(self, topic: str, partition: int, segment: RemoteSegment, k: int) -> None:
        try:
            if k == 0:
                self._indexes(topic, partition, segment, blocking=True)
            self._chunk(topic, partition, segment, k, blocking=True)
        except PymqError as err:  # the read that needs it loads it again and reports the error
            log.debug("%s-%d: prefetch of %s chunk %d failed: %s", topic, partition, segment.log.name, k, err)

    @staticmethod
    def _next_segment(manifest: PartitionManifest, segment: RemoteSegment) -> RemoteSegment | None:
        return manifest.segment_for_offset(segment.next_offset)


def _first_batches(data: bytes, max_bytes: int) -> bytes:
    """The first whole batch of `data` and the ones after it that fit in `max_bytes` (KIP-74)."""
    if len(data) <= max_bytes:
        return data
    end = 0
    while end < len(data):
        size = record.batch_size_at(data, end)
        if size is None or (end and end + size > max_bytes):
            break  # (None cannot happen: `data` is whole, validated batches)
        end += size
    return data[:end]
