"""End-to-end scenarios over real broker processes on loopback, through the real client."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from segment_format import batch_body, record
from client import EARLIEST, LATEST, Admin, Consumer, Producer
from common.errors import OffsetOutOfRangeError
from tests.waiting import wait_until


def values_table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n)
    values = pc.cast(pa.array(ids), pa.string()).cast(pa.binary())
    return pa.table({"key": values, "value": values})


def create(bootstrap: str, topic: str, partitions: int, **configs: object) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, configs=configs)


def assert_in_order_without_gaps(table: pa.Table, partitions: int) -> None:
    for p in range(partitions):
        offsets = table.filter(pc.equal(table["partition"], p))["offset"].to_numpy()
        assert (offsets == np.arange(len(offsets))).all(), f"partition {p} offsets are not 0..n-1 in order"


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"], ids=["uvloop", "asyncio"])
@pytest.mark.slow
def test_round_trip_of_100k_records_on_3_partitions_keeps_order_and_loses_nothing(broker_factory, event_loop, consume_all):
    """100,000 keyed records produced columnar and per record come back complete and in partition order."""
    broker = broker_factory(**{"event.loop": event_loop}).start()
    create(broker.bootstrap, "round-trip", 3)
    with Producer(broker.bootstrap, linger_ms=2, batch_size=64 * 1024) as producer:
        producer.send_batch("round-trip", values_table(90_000))
        futures = [producer.send("round-trip", str(i).encode(), key=str(i).encode()) for i in range(90_000, 100_000)]
        producer.flush()
    assert all(f.result().offset >= 0 for f in futures)
    table = consume_all(broker.bootstrap, "round-trip", 3, 100_000)
    assert sorted(int(v) for v in table["value"].to_pylist()) == list(range(100_000))
    assert_in_order_without_gaps(table, 3)
    for p in range(3):
        # per-partition order: record ids produced by send() appear in increasing order
        values = [int(v) for v in table.filter(pc.equal(table["partition"], p))["value"].to_pylist()]
        sent_one_by_one = [v for v in values if v >= 90_000]
        assert sent_one_by_one == sorted(sent_one_by_one)


def test_records_with_one_key_land_on_one_partition(broker, consume_all):
    """Every record keyed 'customer-42', sent one by one or columnar, lands on the same partition."""
    create(broker.bootstrap, "keyed", 3)
    with Producer(broker.bootstrap, linger_ms=1) as producer:
        singles = [producer.send("keyed", b"v%d" % i, key=b"customer-42") for i in range(200)]
        producer.send_batch("keyed", pa.table({"key": [b"customer-42"] * 300, "value": [b"x"] * 300}))
        producer.flush()
    partitions = {f.result().partition for f in singles}
    assert len(partitions) == 1
    table = consume_all(broker.bootstrap, "keyed", 3, 500)
    assert set(table["partition"].to_pylist()) == partitions


@pytest.mark.parametrize("crash", [True, False], ids=["sigkill", "clean-stop"])
@pytest.mark.slow
def test_restart_keeps_every_acknowledged_record(broker_factory, crash, consume_all):
    """After SIGKILL or SIGTERM and a restart, topics and all acknowledged records are still there."""
    broker = broker_factory(**{"log.flush.interval.messages": 1}).start()
    create(broker.bootstrap, "durable", 2, **{"segment.bytes": 64 * 1024})
    with Producer(broker.bootstrap, acks=1, linger_ms=1) as producer:
        producer.send_batch("durable", values_table(20_000))
        producer.flush()
    if crash:
        broker.kill()
    else:
        assert broker.stop() == 0
    broker.start()
    table = consume_all(broker.bootstrap, "durable", 2, 20_000)
    assert sorted(int(v) for v in table["value"].to_pylist()) == list(range(20_000))
    with Producer(broker.bootstrap) as producer:  # the log is writable where it left off
        metadata = producer.send("durable", b"after-restart", partition=0).result(10)
    assert metadata.offset == table.filter(pc.equal(table["partition"], 0)).num_rows


def test_torn_tail_is_truncated_on_recovery_and_earlier_records_survive(broker_factory, consume_all):
    """Half a batch appended by hand to the active segment is cut off at restart; the rest reads fine."""
    broker = broker_factory().start()
    create(broker.bootstrap, "torn", 1)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for chunk in range(5):
            producer.send_batch("torn", values_table(100, start=chunk * 100))
            producer.flush()
    broker.kill()
    segment = sorted((broker.log_dir / "torn-0").glob("*.log"))[-1]
    size_before = segment.stat().st_size
    torn = record.encode_batch(batch_body.make_body([b"torn"] * 50, timestamps_ms=1))
    with open(segment, "ab") as f:
        f.write(torn[: len(torn) // 2])
    broker.start()
    table = consume_all(broker.bootstrap, "torn", 1, 500)
    assert table["offset"].to_pylist() == list(range(500))
    assert segment.stat().st_size == size_before
    with Producer(broker.bootstrap) as producer:
        assert producer.send("torn", b"next", partition=0).result(10).offset == 500


def test_retention_deletes_old_segments_and_moves_the_log_start(broker_factory):
    """With retention.bytes small, whole old segments go and ListOffsets EARLIEST moves past them."""
    broker = broker_factory(**{"log.retention.check.interval.ms": 100, "file.delete.delay.ms": 0}).start()
    create(broker.bootstrap, "retained", 1, **{"segment.bytes": 16 * 1024, "retention.bytes": 48 * 1024})
    with Producer(broker.bootstrap, linger_ms=0, batch_size=4096) as producer:
        producer.send_batch("retained", values_table(20_000))
        producer.flush()
    partition_dir = broker.log_dir / "retained-0"
    limit = 48 * 1024 + 16 * 1024  # retention.bytes plus the active segment

    def stored_bytes() -> int:
        total = 0
        for segment in partition_dir.glob("*.log"):
            try:
                total += segment.stat().st_size
            except FileNotFoundError:  # deleted by retention between glob and stat
                pass
        return total

    wait_until(lambda: stored_bytes() <= limit, 15, "retention trims the partition to retention.bytes")
    with Admin(broker.bootstrap) as admin:
        start = admin.list_offsets({("retained", 0): EARLIEST})[("retained", 0)][0]
        end = admin.list_offsets({("retained", 0): LATEST})[("retained", 0)][0]
    assert 0 < start < end == 20_000
    segments = list(partition_dir.glob("*.log"))
    assert int(sorted(segments)[0].stem) == start
    consumer = Consumer(broker.bootstrap, auto_offset_reset="none")
    try:
        consumer.assign([("retained", 0)])
        consumer.seek(("retained", 0), 0)
        with pytest.raises(OffsetOutOfRangeError):
            consumer.poll_arrow(timeout_ms=5000)
        consumer.seek(("retained", 0), start)
        assert consumer.poll_arrow(timeout_ms=5000)["offset"][0].as_py() == start
    finally:
        consumer.close()


def test_long_poll_returns_as_soon_as_data_arrives(broker):
    """A fetch that may wait 25 s answers when a produce arrives, not at its timeout. (The bound is
    generous so a loaded machine cannot fail it; a fetch that waited out its time would return
    nothing within the poll's 24 s.)"""
    create(broker.bootstrap, "long-poll", 1)
    consumer = Consumer(broker.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=25_000)
    try:
        consumer.assign([("long-poll", 0)])
        # No sign of a parked fetch shows outside the broker, so these sleeps are not conditions: they
        # give the consumer's first fetch time to park before the produce. Should it not have parked
        # yet (a very loaded machine), the test passes without proving the wake-up; it cannot fail.
        time.sleep(0.5)
        sent_at: list[float] = []

        def produce_later() -> None:
            time.sleep(0.5)  # see above
            with Producer(broker.bootstrap, linger_ms=0) as producer:
                sent_at.append(time.monotonic())
                producer.send("long-poll", b"wake up", partition=0).result(10)

        thread = threading.Thread(target=produce_later)
        thread.start()
        table = consumer.poll_arrow(timeout_ms=24_000)
        received_at = time.monotonic()
        thread.join()
        assert table["value"].to_pylist() == [b"wake up"]
        assert received_at - sent_at[0] < 15.0, "the fetch waited for its timeout instead of the data"
    finally:
        consumer.close()


def test_offsets_for_times_finds_the_first_record_at_or_after_a_time(broker):
    """offsets_for_times maps a timestamp to the first offset with a timestamp at or after it."""
    create(broker.bootstrap, "timed", 1)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for i, ts in enumerate([1_000, 2_000, 3_000]):
            producer.send_batch("timed", pa.table({"value": [b"a", b"b"], "timestamp": [ts, ts]}))
            producer.flush()
    consumer = Consumer(broker.bootstrap)
    try:
        consumer.assign([("timed", 0)])
        found = consumer.offsets_for_times({("timed", 0): 1_500})
        assert found[("timed", 0)] == (2, 2_000)
        assert consumer.offsets_for_times({("timed", 0): 9_999})[("timed", 0)] is None
    finally:
        consumer.close()


def test_producer_starts_using_added_partitions_after_a_metadata_refresh(broker):
    """After CreatePartitions, a running producer spreads keys over the new partitions too."""
    create(broker.bootstrap, "growing", 1)
    with Producer(broker.bootstrap, linger_ms=0, metadata_max_age_ms=200) as producer:
        assert {producer.send("growing", b"x", key=b"k%d" % i).result(10).partition for i in range(20)} == {0}
        with Admin(broker.bootstrap) as admin:
            admin.create_partitions("growing", 3)
        time.sleep(0.3)  # not a condition: metadata_max_age_ms (200 ms) passes, so the next dispatch refreshes
        producer.send("growing", b"x", key=b"trigger").result(10)  # the dispatch that refreshes
        used = {producer.send("growing", b"x", key=b"k%d" % i).result(10).partition for i in range(50)}
    assert used == {0, 1, 2}


def test_log_append_time_topic_reports_the_broker_time_to_consumers(broker, consume_all):
    """With message.timestamp.type=LogAppendTime, consumers see the append time, not the producer's."""
    create(broker.bootstrap, "append-time", 1, **{"message.timestamp.type": "LogAppendTime"})
    before = batch_body.now_ms()
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        metadata = producer.send("append-time", b"x", timestamp_ms=1_000).result(10)
    assert metadata.timestamp >= before
    table = consume_all(broker.bootstrap, "append-time", 1, 1)
    assert table["timestamp_type"].to_pylist() == [1]
    assert table["timestamp"].cast(pa.int64()).to_pylist() == [metadata.timestamp]
