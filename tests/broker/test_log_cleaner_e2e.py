"""The log cleaner in a real broker process: a topic with cleanup.policy=compact ends up holding
the latest value of each key at its original offset, in far fewer bytes; SIGKILL while the cleaner
is writing or swapping segments loses none of those latest values."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from broker.process import BrokerProcess
from client import Admin, Consumer, Producer
from segment_format.layout import CLEANED_SUFFIX, SWAP_SUFFIX
from tests.waiting import wait_until

TOPIC = "compacted"
FAST_CLEANER = {"log.cleaner.backoff.ms": 20, "file.delete.delay.ms": 0, "log.retention.check.interval.ms": 100}


def create_compacted(bootstrap: str, segment_bytes: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, configs={
            "cleanup.policy": "compact", "segment.bytes": segment_bytes, "min.cleanable.dirty.ratio": 0.01})


def produce_updates(bootstrap: str, start: int, count: int, keys: int, value_bytes: int, seed: int) -> dict[bytes, bytes]:
    """`count` records with uniformly random keys among `keys`; record i's value starts with i
    (zero-padded), so a consumer can tell its original offset. Returns each key's last value."""
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, keys, count)
    latest: dict[bytes, bytes] = {}
    with Producer(bootstrap, linger_ms=5) as producer:
        for chunk in range(0, count, 1000):
            ids = range(start + chunk, start + min(chunk + 1000, count))
            key_list = [b"key-%05d" % chosen[i - start] for i in ids]
            value_list = [b"%010d" % i + b"v" * (value_bytes - 10) for i in ids]
            producer.send_batch(TOPIC, pa.table({"key": key_list, "value": value_list}))
            latest.update(zip(key_list, value_list))
        producer.flush()
    return latest


def produce_filler(bootstrap: str, start: int, count: int, value_bytes: int) -> dict[bytes, bytes]:
    """Records with keys of their own: they push the last updates out of the active segment (which
    the cleaner never touches) and are each their key's latest value."""
    filler = {b"filler-%d" % i: b"%010d" % i + b"f" * (value_bytes - 10) for i in range(start, start + count)}
    with Producer(bootstrap, linger_ms=5) as producer:
        producer.send_batch(TOPIC, pa.table({"key": list(filler), "value": list(filler.values())}))
        producer.flush()
    return filler


def partition_dir(log_dir: Path) -> Path:
    return log_dir / f"{TOPIC}-0"


def partition_bytes(log_dir: Path) -> int:
    """Bytes of the partition's files; one the cleaner renames or deletes while they are listed
    does not count (it was seen once to vanish between the listing and its stat)."""
    total = 0
    for path in partition_dir(log_dir).iterdir():
        with contextlib.suppress(FileNotFoundError):
            if path.is_file():
                total += path.stat().st_size
    return total


def read_everything(bootstrap: str, end_offset: int) -> pa.Table:
    """Every record from offset 0 up to `end_offset` (the log's end; the last record survives
    compaction, being its key's latest), then checks nothing more comes."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(TOPIC, 0)])
        tables, last = [], -1
        deadline = time.monotonic() + 60
        while last < end_offset - 1:
            assert time.monotonic() < deadline, f"read up to offset {last} of {end_offset}"
            table = consumer.poll_arrow(timeout_ms=500)
            if table.num_rows:
                tables.append(table)
                last = table["offset"][-1].as_py()
        assert consumer.poll_arrow(timeout_ms=200).num_rows == 0
        return pa.concat_tables(tables)
    finally:
        consumer.close()


def assert_latest_values_at_their_offsets(table: pa.Table, latest: dict[bytes, bytes]) -> None:
    """Exactly one record per key, its latest value, at the offset the value names."""
    keys, values, offsets = table["key"].to_pylist(), table["value"].to_pylist(), table["offset"].to_pylist()
    assert len(keys) == len(set(keys)) == len(latest)
    assert dict(zip(keys, values)) == latest
    assert offsets == sorted(offsets) and all(offset == int(value[:10]) for offset, value in zip(offsets, values))


@pytest.mark.slow
def test_a_compacted_topic_keeps_the_latest_value_of_each_key_at_its_offset(broker_factory):
    """20,000 updates of 50 keys in 16 KiB segments: the cleaner reduces the partition to each
    key's latest value, read from offset 0 at its original offset (with gaps between), and the
    partition directory shrinks to a small bounded size."""
    broker = broker_factory(**FAST_CLEANER).start()
    create_compacted(broker.bootstrap, 16 << 10)
    latest = produce_updates(broker.bootstrap, 0, 20_000, 50, 20, seed=1)
    latest.update(produce_filler(broker.bootstrap, 20_000, 400, 20))
    produced = 20_400 * 20
    wait_until(lambda: partition_bytes(broker.log_dir) < 48 << 10, 30, "the partition is compacted")
    table = read_everything(broker.bootstrap, 20_400)
    assert_latest_values_at_their_offsets(table, latest)
    assert partition_bytes(broker.log_dir) < min(48 << 10, produced // 8)
    assert "cleaned compacted-0" in broker.log_tail(200_000)


@dataclass
class Updates:
    """Updates of `keys` keys produced so far, each record's value naming its offset: the next
    offset, and each key's latest value."""

    bootstrap: str
    keys: int
    value_bytes: int
    produced: int = 0
    latest: dict[bytes, bytes] = field(default_factory=dict)

    def produce(self, count: int) -> None:
        """`count` more updates, acknowledged before it returns (so a kill never meets one in flight)."""
        self.latest.update(produce_updates(self.bootstrap, self.produced, count, self.keys, self.value_bytes,
                                           seed=self.produced))
        self.produced += count


TOP_UP_AFTER_S = 1.0  # no cleaned segment seen for this long: the cleaner may have nothing left to clean
TOP_UP_UPDATES = 10_000  # > segment.bytes of updates: a roll, so a new dirty segment and another pass
KILL_ATTEMPTS = 5


def cleaner_files(directory: Path) -> list[Path]:
    """The `.cleaned` / `.swap` files in `directory`: a cleaned segment being written or swapped in."""
    return [path for path in directory.iterdir() if path.suffix in (CLEANED_SUFFIX, SWAP_SUFFIX)]


def kill_while_cleaning(broker: BrokerProcess, updates: Updates) -> None:
    """SIGKILL `broker` while its cleaner writes or swaps a cleaned segment, as the directory
    shows once the process is dead.

    Those files live for milliseconds, and a pass may end before the first look or between two
    looks, after which nothing is dirty and no pass makes them again: so while none is seen, more
    updates roll a segment every TOP_UP_AFTER_S, each starting another pass. A kill that came just
    after a pass's last rename froze no such file: the broker restarts and it is tried again."""
    directory = partition_dir(broker.log_dir)
    top_up_at = time.monotonic() + TOP_UP_AFTER_S

    def cleaning() -> bool:
        nonlocal top_up_at
        if cleaner_files(directory):
            return True
        if time.monotonic() >= top_up_at:
            updates.produce(TOP_UP_UPDATES)
            top_up_at = time.monotonic() + TOP_UP_AFTER_S
        return False

    for _ in range(KILL_ATTEMPTS):
        wait_until(cleaning, 30, "the cleaner writes a cleaned segment", 0.002)
        broker.kill()
        if cleaner_files(directory):
            return
        broker.start()
    raise AssertionError(f"{KILL_ATTEMPTS} kills in a row came after the cleaned segment was swapped in")


@pytest.mark.slow
def test_sigkill_while_the_cleaner_works_loses_no_latest_value(broker_factory):
    """SIGKILL three times while a cleaned segment is being written or swapped in (`.cleaned` /
    `.swap` files in the directory the kill froze), more updates after each restart: the log
    reopens every time, and once cleaned holds exactly the latest value of every key at its offset."""
    broker = broker_factory(**FAST_CLEANER).start()
    create_compacted(broker.bootstrap, 1 << 20)
    updates = Updates(broker.bootstrap, keys=2000, value_bytes=100)
    for _ in range(3):
        updates.produce(100_000)
        kill_while_cleaning(broker, updates)
        broker.start()
    updates.latest.update(produce_filler(broker.bootstrap, updates.produced, 12_000, updates.value_bytes))  # a roll
    produced = updates.produced + 12_000

    def cleaned() -> pa.Table | None:
        table = read_everything(broker.bootstrap, produced)
        return table if len(set(table["key"].to_pylist())) == table.num_rows else None

    table = wait_until(cleaned, 60, "the cleaner finishes (one record a key)", 0.1)
    assert_latest_values_at_their_offsets(table, updates.latest)
    assert partition_bytes(broker.log_dir) < produced * updates.value_bytes / 10
