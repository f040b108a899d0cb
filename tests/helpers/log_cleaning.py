"""Log-cleaning test helpers: keyed records appended to a UnifiedLog and read back as entries
(offset, key, value), the model of what compaction keeps (`latest`), and a log laid out for a
cleaned-segment swap with what the cleaner writes for it (`build`, `write_cleaned`)."""
from __future__ import annotations

from broker.log import Segment, UnifiedLog
from broker.log.segment import BatchInfo
from segment_format import batch_body, record
from segment_format.compaction import build_offset_map, compact_batches
from segment_format.layout import CLEANED_SUFFIX
from tests.broker.log.appends import append

NOW_MS = 1_000_000
DAY_MS = 86_400_000
VALUE = b"x" * 200  # three records a batch, two batches a 4 KiB segment
GROUP = 3  # segments in the swapped group: renames 0-2 commit it, 3-11 retire the old ones, 12-14 finish

Entry = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


def keyed_batch(records: list[tuple[bytes | None, bytes | None]], timestamp_ms: int = NOW_MS) -> bytearray:
    body = batch_body.make_body([value for _, value in records], keys=[key for key, _ in records], timestamps_ms=timestamp_ms)
    return record.encode_batch(body)


def produce(partition_log: UnifiedLog, records: list[tuple[bytes | None, bytes | None]], per_batch: int = 5,
            timestamp_ms: int = NOW_MS) -> list[Entry]:
    """Append `records` in batches of `per_batch` and make them cleanable (high watermark and
    recovery point at the LEO); returns them with their offsets."""
    written = []
    for i in range(0, len(records), per_batch):
        chunk = records[i:i + per_batch]
        info = append(partition_log, keyed_batch(chunk, timestamp_ms))
        written += [(info.first_offset + j, key, value) for j, (key, value) in enumerate(chunk)]
    partition_log.flush()
    return written


def latest(entries: list[Entry]) -> list[Entry]:
    """The model: null keys kept, and each key's last record."""
    last = {key: offset for offset, key, _ in entries if key is not None}
    return [(offset, key, value) for offset, key, value in entries if key is None or last[key] == offset]


def read_all(partition_log: UnifiedLog, start: int | None = None) -> list[Entry]:
    """Every record a consumer fetching from `start` (default: the log start) to the LEO sees."""
    out: list[Entry] = []
    offset = partition_log.log_start_offset if start is None else start
    while offset < partition_log.log_end_offset:
        fetched = partition_log.read(offset, 1 << 20, max_offset=partition_log.log_end_offset)
        data = fetched.read_bytes()
        fetched.close()
        assert data, f"nothing fetched at {offset} below the LEO {partition_log.log_end_offset}"
        position = 0
        while position + record.HEADER_SIZE <= len(data):
            size = record.read_header(data, position).size
            if position + size > len(data):
                break
            header, body = record.decode_batch(data, position)
            offsets = record.record_offsets(header, body).to_pylist()
            out += [entry for entry in zip(offsets, body.column("key").to_pylist(), body.column("value").to_pylist())
                    if entry[0] >= offset]
            offset = header.next_offset
            position += size
    return out


def records_for(scenario: str) -> list[tuple[bytes, bytes]]:
    """Six records a segment. "survivors": the group's last segment keeps its records (the first
    two are superseded by it). "emptied": only the group's first segment keeps records; the next
    two are superseded by the segment after the group, so the cleaned segment ends before them."""
    if scenario == "survivors":
        return [(b"k%d" % (i % 6), VALUE) for i in range(18)] + [(b"tail%d" % i, VALUE) for i in range(20)]
    return ([(b"u%d" % i, VALUE) for i in range(6)] + [(b"k%d" % (i % 6), VALUE) for i in range(18)]
            + [(b"tail%d" % i, VALUE) for i in range(14)])


def build(open_log, scenario: str) -> tuple[UnifiedLog, list[Entry]]:
    partition_log = open_log(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    written = produce(partition_log, records_for(scenario), per_batch=3)
    assert [s.next_offset - s.base_offset for s in partition_log.segments()[:GROUP + 1]] == [6] * (GROUP + 1)
    return partition_log, written


def write_cleaned(partition_log: UnifiedLog, cache) -> tuple[Segment, list[Segment]]:
    """What the cleaner writes for the first GROUP segments with a map of every sealed segment:
    their survivors in one sealed, fsynced `.cleaned` segment."""
    sealed = partition_log.segments()[:-1]
    group = sealed[:GROUP]

    def batches(segments: list[Segment]):
        for segment in segments:
            with segment.detached_reader() as reader:
                yield from reader.stored_batches()

    offset_map = build_offset_map(batches(sealed), 1000)
    cleaned = Segment.create(partition_log.directory, group[0].base_offset, cache, CLEANED_SUFFIX)
    data, infos = bytearray(), []
    for out in compact_batches(batches(group), offset_map, NOW_MS, DAY_MS):
        header = record.read_header(out)
        infos.append(BatchInfo(header.base_offset, header.next_offset, header.size, header.max_timestamp))
        data += out
    if infos:
        cleaned.append(memoryview(data), infos, 0, NOW_MS)
    cleaned.seal()
    cleaned.flush()
    return cleaned, group
