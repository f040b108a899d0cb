"""Consumer against a real broker process: assignment, polling, seeking, offset resets and lookups,
a broker restart under a live consumer, and CRC checks on corrupted stored batches."""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from segment_format import batch_body, record
from tests.broker.forged_batches import poison_stored_batch
from client import RECORD_SCHEMA, Admin, Consumer, ConsumerRecord, Producer
from tests.helpers.client_records import poll_until, produce, values
from tests.waiting import wait_until
from common.errors import (
    CorruptMessageError,
    CorruptRecordError,
    InconsistentTopicIdError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)


# -- assignment and polling --------------------------------------------------------------------


def test_assign_and_poll_returns_records_in_offset_order_per_partition(shared_broker, new_topic, consumers):
    """60 keyed records on 3 partitions come back complete, each partition in offset order without gaps."""
    topic = new_topic(3)
    produce(shared_broker.bootstrap, topic, values(60))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, p) for p in range(3)])
    assert sorted(consumer.assignment()) == [(topic, 0), (topic, 1), (topic, 2)]
    records = poll_until(consumer, 60)
    assert sorted(r.value for r in records) == sorted(values(60))
    for p in range(3):
        mine = [r for r in records if r.partition == p]
        assert [r.offset for r in mine] == list(range(len(mine)))
        # send order within a partition is offset order
        assert [int(r.value[1:]) for r in mine] == sorted(int(r.value[1:]) for r in mine)
    assert all(r.topic == topic and r.timestamp_type == 0 for r in records)


def test_poll_with_max_records_returns_exactly_that_many_then_the_rest(shared_broker, new_topic, consumers):
    """One batch of 10: poll(max_records=4) gives offsets 0..3, the next poll 4..9."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(10), one_batch=True)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    first = consumer.poll(timeout_ms=5000, max_records=4)
    assert [r.offset for r in first] == [0, 1, 2, 3]
    rest = consumer.poll(timeout_ms=5000)
    assert [r.offset for r in rest] == list(range(4, 10))
    assert [r.value for r in first + rest] == values(10)


def test_poll_arrow_schema_is_record_schema(shared_broker, new_topic, consumers):
    """poll_arrow returns RECORD_SCHEMA tables, with data and when nothing arrived."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    table = consumer.poll_arrow(timeout_ms=5000)
    assert table.num_rows == 3
    assert table.schema.equals(RECORD_SCHEMA)
    empty = consumer.poll_arrow(timeout_ms=100)
    assert empty.num_rows == 0 and empty.schema.equals(RECORD_SCHEMA)


# -- positions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1, 4, 9], ids=["first", "second", "middle", "last"])
def test_seek_into_a_batch_starts_exactly_at_that_offset(shared_broker, new_topic, consumers, offset):
    """seek to any offset inside one stored batch of 10: the first record returned has that offset."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(10), one_batch=True)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    consumer.seek((topic, 0), offset)
    records = poll_until(consumer, 10 - offset)
    assert [r.offset for r in records] == list(range(offset, 10))
    assert [r.value for r in records] == values(10)[offset:]


def test_seek_to_beginning_and_end(shared_broker, new_topic, consumers):
    """After reading, seek_to_beginning replays from 0; seek_to_end skips to the end and sees only new records."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(5))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    assert [r.offset for r in poll_until(consumer, 5)] == list(range(5))
    consumer.seek_to_beginning()
    assert [r.offset for r in poll_until(consumer, 5)] == list(range(5))
    consumer.seek_to_beginning((topic, 0))
    consumer.seek_to_end((topic, 0))
    assert consumer.position((topic, 0)) == 5
    assert consumer.poll(timeout_ms=200) == []
    produce(shared_broker.bootstrap, topic, [b"new"])
    assert [(r.offset, r.value) for r in poll_until(consumer, 1)] == [(5, b"new")]


def test_position_advances_past_polled_records(shared_broker, new_topic, consumers):
    """Once everything stored was polled, position is the next offset to be written (8, then 10)."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(8))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    poll_until(consumer, 8)
    assert consumer.position((topic, 0)) == 8
    produce(shared_broker.bootstrap, topic, values(2))
    poll_until(consumer, 2)
    assert consumer.position((topic, 0)) == 10


def test_position_is_the_next_record_poll_will_return(shared_broker, new_topic, consumers):
    """Right after assign position is 0 even once prefetched; after poll(max_records=4) of a 10-record batch it is 4."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(10), one_batch=True)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    wait_until(lambda: consumer.metrics()["records-lag"].get((topic, 0)) == 10, 10,
               "the background fetcher fetched the batch (its high watermark 10 known)")
    assert consumer.position((topic, 0)) == 0
    assert len(consumer.poll(timeout_ms=5000, max_records=4)) == 4
    assert consumer.position((topic, 0)) == 4


@pytest.mark.parametrize(
    "reset, expected_offsets",
    [("earliest", [0, 1, 2, 3, 4, 5]), ("latest", [5])],
    ids=["earliest", "latest"],
)
def test_auto_offset_reset_sets_the_start_on_assign(shared_broker, new_topic, consumers, reset, expected_offsets):
    """5 records exist before assign: 'earliest' reads them and the 6th, 'latest' only the 6th."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(5))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset=reset)
    consumer.assign([(topic, 0)])
    if reset == "latest":
        assert consumer.position((topic, 0)) == 5
        assert consumer.poll(timeout_ms=300) == []
    produce(shared_broker.bootstrap, topic, [b"sixth"])
    records = poll_until(consumer, len(expected_offsets))
    assert [r.offset for r in records] == expected_offsets
    assert records[-1].value == b"sixth"


def test_out_of_range_position_with_reset_none_raises_from_poll(shared_broker, new_topic, consumers):
    """auto_offset_reset='none' and a position past the end: poll raises OffsetOutOfRangeError."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="none")
    consumer.assign([(topic, 0)])
    consumer.seek((topic, 0), 100)
    with pytest.raises(OffsetOutOfRangeError):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
    consumer.seek((topic, 0), 1)  # a valid position afterwards works again
    assert [r.offset for r in poll_until(consumer, 2)] == [1, 2]


@pytest.mark.parametrize("reset, first_offset", [("earliest", 0), ("latest", 3)], ids=["earliest", "latest"])
def test_out_of_range_position_is_reset_per_auto_offset_reset(shared_broker, new_topic, consumers, reset, first_offset):
    """A position past the end is moved to the beginning ('earliest') or the end ('latest') instead of raising."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset=reset)
    consumer.assign([(topic, 0)])
    consumer.seek((topic, 0), 100)
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + 10
    while consumer.position((topic, 0)) == 100 and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=100)
    assert consumer.position((topic, 0)) != 100, "the out-of-range position was never reset"
    produce(shared_broker.bootstrap, topic, [b"after"])
    records += poll_until(consumer, 4 - first_offset - len(records))
    assert [r.offset for r in records] == list(range(first_offset, 4))


def test_reset_none_without_a_seek_raises_no_offset_for_partition(shared_broker, new_topic, consumers):
    """auto_offset_reset='none', assigned but never sought: position and poll raise NoOffsetForPartitionError."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3))
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="none")
    consumer.assign([(topic, 0)])
    with pytest.raises(NoOffsetForPartitionError):
        consumer.position((topic, 0))
    with pytest.raises(NoOffsetForPartitionError):
        consumer.poll(timeout_ms=300)


# -- offset lookups ----------------------------------------------------------------------------


def test_beginning_and_end_offsets(shared_broker, new_topic, consumers):
    """beginning_offsets is 0 and end_offsets the record count, per partition (0/0 when empty)."""
    topic = new_topic(2)
    produce(shared_broker.bootstrap, topic, values(7), partition=1)
    consumer = consumers(shared_broker.bootstrap)
    tps = [(topic, 0), (topic, 1)]
    assert consumer.beginning_offsets(tps) == {(topic, 0): 0, (topic, 1): 0}
    assert consumer.end_offsets(tps) == {(topic, 0): 0, (topic, 1): 7}


@pytest.mark.parametrize(
    "query, expected",
    [(0, (0, 1000)), (1000, (0, 1000)), (1500, (1, 2000)), (3000, (2, 3000)), (3001, None)],
    ids=["before-all", "exact-first", "between", "exact-last", "after-all"],
)
@pytest.mark.parametrize("one_batch", [False, True], ids=["batch-per-record", "one-batch"])
def test_offsets_for_times_finds_first_record_at_or_after(shared_broker, new_topic, consumers, one_batch, query, expected):
    """Records stamped 1000, 2000, 3000: each query time maps to the first record at or after it, or None."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(3), partition=0, timestamps=[1000, 2000, 3000], one_batch=one_batch)
    consumer = consumers(shared_broker.bootstrap)
    assert consumer.offsets_for_times({(topic, 0): query}) == {(topic, 0): expected}


@pytest.mark.parametrize("partition", [0, 5], ids=["unknown-topic", "unknown-partition"])
def test_assign_to_unknown_topic_or_partition_raises(shared_broker, new_topic, consumers, partition):
    """Assigning a topic that does not exist, or a partition past the count, raises UnknownTopicOrPartitionError."""
    topic = new_topic(2) if partition else "no-such-topic"
    consumer = consumers(shared_broker.bootstrap)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.assign([(topic, partition)])
    assert consumer.assignment() == []


# -- failures ----------------------------------------------------------------------------------


def test_consumer_keeps_working_across_a_broker_restart(broker_factory, consumers):
    """Broker SIGKILLed and restarted on its port: the live consumer receives records produced afterwards."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("restart", partitions=2)
    produce(broker.bootstrap, "restart", values(10))
    consumer = consumers(broker.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50)
    consumer.assign([("restart", 0), ("restart", 1)])
    assert len(poll_until(consumer, 10)) == 10
    broker.kill()
    assert consumer.poll(timeout_ms=300) == []
    broker.start()
    produce(broker.bootstrap, "restart", values(10, b"after"))
    records = poll_until(consumer, 10, timeout_s=30)
    assert sorted(r.value for r in records) == sorted(values(10, b"after"))
    assert consumer.poll(timeout_ms=300) == []


def stored_segment(log_dir: Path, topic: str, partition: int) -> Path:
    [segment] = sorted((log_dir / f"{topic}-{partition}").glob("*.log"))
    return segment


def test_check_crcs_detects_a_batch_corrupted_on_disk(broker_factory, consumers):
    """A body byte flipped in a stored batch below the recovery point (not re-validated on a clean restart)
    is caught by the consumer's CRC check: poll raises CorruptMessageError; without the check the bad byte shows.

    A clean stop checkpoints recovery point = LEO; on open, the segment holding it is loaded from its
    indexes and only batches from the last offset-index entry on are re-validated
    (PartitionLog._load_trusted -> Segment.load). With index.interval.bytes=0 every batch after the
    first gets an entry, so the first of five batches is never re-checked by the broker.
    """
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("crc", partitions=1, configs={"index.interval.bytes": 0})
    for i in range(5):
        produce(broker.bootstrap, "crc", [b"corrupt-me-%d" % i])  # one batch each
    assert broker.stop() == 0
    segment = stored_segment(broker.log_dir, "crc", 0)
    data = bytearray(segment.read_bytes())
    at = data.index(b"corrupt-me-0")
    data[at] ^= 0x20  # 'c' -> 'C': the Arrow structure stays valid, only the CRC disagrees
    segment.write_bytes(bytes(data))
    broker.start()

    checked = consumers(broker.bootstrap, auto_offset_reset="earliest", check_crcs=True)
    checked.assign([("crc", 0)])
    assert checked.end_offsets([("crc", 0)]) == {("crc", 0): 5}  # recovery truncated nothing
    with pytest.raises(CorruptMessageError):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            checked.poll(timeout_ms=200)

    unchecked = consumers(broker.bootstrap, auto_offset_reset="earliest", check_crcs=False)
    unchecked.assign([("crc", 0)])
    records = poll_until(unchecked, 5)
    assert [r.value for r in records] == [b"Corrupt-me-0"] + [b"corrupt-me-%d" % i for i in range(1, 5)]


def produce_one_batch_each(bootstrap: str, topic: str, partition: int, values_: list[bytes]) -> None:
    """Each value as a record batch of its own (flushed one by one)."""
    with Producer(bootstrap, linger_ms=0) as producer:
        for value in values_:
            future = producer.send(topic, value, partition=partition)
            producer.flush()
            future.result(10)


def flip_stored_byte(log_dir: Path, topic: str, partition: int, marker: bytes) -> Path:
    """Flip one bit inside `marker` in the partition's segment holding it, which must be a sealed
    one (the broker re-validates the active segment's tail on start); return that segment."""
    segments = sorted((log_dir / f"{topic}-{partition}").glob("*.log"))
    for segment in segments:
        data = bytearray(segment.read_bytes())
        at = data.find(marker)
        if at >= 0:
            assert segment != segments[-1], "the batch to corrupt is in the active segment"
            data[at] ^= 0x20  # the Arrow structure stays valid, only the CRC disagrees
            segment.write_bytes(bytes(data))
            return segment
    raise AssertionError(f"{marker!r} is in no segment of {topic}-{partition}")


def test_records_before_a_corrupt_batch_are_delivered_and_seek_past_it_continues(broker_factory, consumers):
    """A batch corrupted on disk in a sealed segment: the poll that reaches it returns every intact
    record before it (and the other partition's records) with position() at the bad batch, the
    next poll raises CorruptRecordError naming topic, partition and offset, and a skip-and-continue
    loop receives every good record exactly once."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("skip", partitions=2, configs={"segment.bytes": 4096})
    filler = b"x" * 600  # a few batches per 4 KiB segment: offsets 0 and 1 share the first, sealed one
    good = {p: [b"p%d-%d-" % (p, i) + filler for i in range(6)] for p in (0, 1)}
    for partition, vals in good.items():
        produce_one_batch_each(broker.bootstrap, "skip", partition, vals)
    assert broker.stop() == 0  # clean stop: the recovery point is the log end, so nothing is re-validated
    segment = flip_stored_byte(broker.log_dir, "skip", 0, b"p0-1-")
    assert segment.name == f"{0:020d}.log"
    broker.start()

    consumer = consumers(broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([("skip", 0), ("skip", 1)])
    assert consumer.end_offsets([("skip", 0)]) == {("skip", 0): 6}  # the broker kept and serves the bad batch
    received: list[ConsumerRecord] = []
    errors: list[CorruptRecordError] = []
    deadline = time.monotonic() + 20
    while len(received) < 11 and time.monotonic() < deadline:
        try:
            batch = consumer.poll(timeout_ms=200)
        except CorruptRecordError as err:
            assert [r.offset for r in received if r.partition == 0] == [0], "raised before delivering offset 0"
            assert consumer.position(("skip", 0)) == err.offset
            errors.append(err)
            consumer.seek((err.topic, err.partition), err.offset + 1)
            continue
        received += batch
        if any(r.partition == 0 and r.offset == 0 for r in batch):
            assert consumer.position(("skip", 0)) == 1, "position stops short of the bad batch"
    assert [(e.topic, e.partition, e.offset) for e in errors] == [("skip", 0, 1)]
    assert isinstance(errors[0], CorruptMessageError)
    delivered = sorted((r.partition, r.offset, r.value) for r in received)
    assert delivered == sorted((p, i, v) for p, vals in good.items() for i, v in enumerate(vals) if (p, i) != (0, 1))
    assert consumer.poll(timeout_ms=300) == []


def test_corrupt_batch_is_raised_again_until_the_caller_seeks(broker_factory, consumers):
    """Polling on after CorruptRecordError without a seek raises it again (nothing is skipped
    silently); poll_arrow behaves like poll."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("again", partitions=1, configs={"segment.bytes": 4096})
    filler = b"y" * 600
    produce_one_batch_each(broker.bootstrap, "again", 0, [b"a-%d-" % i + filler for i in range(4)])
    assert broker.stop() == 0
    flip_stored_byte(broker.log_dir, "again", 0, b"a-0-")
    broker.start()

    consumer = consumers(broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([("again", 0)])
    for _ in range(2):
        with pytest.raises(CorruptRecordError) as raised:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                assert consumer.poll_arrow(timeout_ms=200).num_rows == 0
        assert (raised.value.topic, raised.value.partition, raised.value.offset) == ("again", 0, 0)
        assert consumer.position(("again", 0)) == 0
    consumer.seek(("again", 0), 1)
    table = poll_until_rows(consumer, 3)
    assert table.column("offset").to_pylist() == [1, 2, 3]


def skip_corrupt_batches(consumer: Consumer, expected: int, skip_to: str) -> tuple[list[int], list[tuple[int, int]]]:
    """A skip-and-continue loop: poll until `expected` records arrived, seeking past each
    CorruptRecordError to `err.<skip_to> + 1`; the offsets received and the errors' (offset,
    last_offset)."""
    received: list[int] = []
    errors: list[tuple[int, int]] = []
    deadline = time.monotonic() + 20
    while len(received) < expected and time.monotonic() < deadline:
        try:
            received += [r.offset for r in consumer.poll(timeout_ms=200)]
        except CorruptRecordError as err:
            assert consumer.position((err.topic, err.partition)) == err.offset
            errors.append((err.offset, err.last_offset))
            consumer.seek((err.topic, err.partition), getattr(err, skip_to) + 1)
    return received, errors


def test_a_corrupt_batch_followed_by_a_good_one_in_one_fetch_is_skipped_exactly(broker_factory, consumers):
    """Issue 34 item 3: batches at 0, 1-3 and 4-5 come in one fetch and the middle one's CRC holds
    but its body does not decode (poisoned on disk). CorruptRecordError names offsets 1-3, not the
    next batch's 4, and position() is 1: seek(last_offset + 1) skips exactly the bad batch, and
    the older recovery seek(offset + 1) steps through it one record at a time; neither drops 4."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("poisoned", partitions=1)
    for batch in ([b"a"], [b"b1", b"b2", b"b3"], [b"c1", b"c2"]):
        produce(broker.bootstrap, "poisoned", batch, one_batch=True)
    assert broker.stop() == 0  # clean stop: nothing is re-validated on start
    segment = stored_segment(broker.log_dir, "poisoned", 0)
    data = bytearray(segment.read_bytes())
    [at] = [pos for pos, header in record.iter_batches(data) if header.base_offset == 1]
    poison_stored_batch(data, at)
    segment.write_bytes(bytes(data))
    broker.start()

    whole = consumers(broker.bootstrap, auto_offset_reset="earliest")
    whole.assign([("poisoned", 0)])
    assert skip_corrupt_batches(whole, 3, "last_offset") == ([0, 4, 5], [(1, 3)])
    stepwise = consumers(broker.bootstrap, auto_offset_reset="earliest")
    stepwise.assign([("poisoned", 0)])
    assert skip_corrupt_batches(stepwise, 3, "offset") == ([0, 4, 5], [(1, 3), (2, 3), (3, 3)])


def recreate_topic(bootstrap: str, topic: str) -> None:
    """Delete `topic` and create it again (one partition): a new incarnation, with a new topic id."""
    with Admin(bootstrap) as admin:
        old = {t.name: t.topic_id for t in admin.describe_topics([topic])}[topic]
        admin.delete_topics([topic])
        admin.create_topic(topic, partitions=1)
        assert admin.describe_topics([topic])[0].topic_id != old


def test_an_assigned_topic_deleted_and_recreated_is_read_from_the_new_start(broker_factory, consumers):
    """Issue 34 item 6: an assign() consumer that read 5 records of a topic which is then deleted
    and re-created with 8 new ones fetches again (it stopped for good before) and, per
    auto_offset_reset=earliest, from the new topic's start: all 8, not the 3 past its old position."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("reborn", partitions=1)
    produce(broker.bootstrap, "reborn", values(5, b"old-"), partition=0)
    consumer = consumers(broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([("reborn", 0)])
    assert [r.value for r in poll_until(consumer, 5)] == values(5, b"old-")
    recreate_topic(broker.bootstrap, "reborn")
    produce(broker.bootstrap, "reborn", values(8, b"new-"), partition=0)
    records = poll_until(consumer, 8)
    assert [(r.offset, r.value) for r in records] == list(enumerate(values(8, b"new-")))
    assert consumer.position(("reborn", 0)) == 8


def test_with_no_reset_a_recreated_topic_raises_inconsistent_topic_id_until_a_seek(broker_factory, consumers):
    """With auto_offset_reset="none" the consumer does not guess: the poll after the re-creation
    raises InconsistentTopicIdError naming the partition, later polls NoOffsetForPartitionError
    (the old position is gone), and a seek reads the new topic from there."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("reborn", partitions=1)
    produce(broker.bootstrap, "reborn", values(5, b"old-"), partition=0)
    consumer = consumers(broker.bootstrap, auto_offset_reset="none")
    consumer.assign([("reborn", 0)])
    consumer.seek(("reborn", 0), 0)
    poll_until(consumer, 5)
    recreate_topic(broker.bootstrap, "reborn")
    produce(broker.bootstrap, "reborn", values(3, b"new-"), partition=0)
    with pytest.raises(InconsistentTopicIdError, match="reborn-0: the topic was deleted and re-created"):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert consumer.poll(timeout_ms=200) == []
    with pytest.raises(NoOffsetForPartitionError):
        consumer.poll(timeout_ms=200)
    consumer.seek(("reborn", 0), 1)
    assert [(r.offset, r.value) for r in poll_until(consumer, 2)] == [(1, b"new-1"), (2, b"new-2")]


def test_an_assigned_topic_deleted_for_good_is_logged_once_gone_and_once_back(shared_broker, new_topic, consumers,
                                                                              caplog):
    """Issue 34 item 6: an assign() consumer whose topic is deleted keeps polling (empty polls, its
    metadata refreshed with capped backoff) and warns once, naming the topic, however many
    refreshes find it gone; once it is created again, one more warning says it is back and its
    new records arrive."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(2, b"old-"), partition=0)
    consumer = consumers(shared_broker.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=20)
    consumer.assign([(topic, 0)])
    poll_until(consumer, 2)
    refreshes = 0
    cluster = consumer._core._fetcher.cluster
    refresh = cluster.refresh

    async def counted(*args, **kwargs):
        nonlocal refreshes
        refreshes += 1
        await refresh(*args, **kwargs)

    cluster.refresh = counted
    caplog.set_level("WARNING", logger="pymq.consumer")

    def warnings(word: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if topic in r.getMessage() and word in r.getMessage()]

    with Admin(shared_broker.bootstrap) as admin:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 20
        while not (warnings("is gone") and refreshes >= 5):
            assert time.monotonic() < deadline, (refreshes, caplog.messages)
            assert consumer.poll(timeout_ms=50) == []
        admin.create_topic(topic, partitions=1)
    produce(shared_broker.bootstrap, topic, values(3, b"new-"), partition=0)
    assert [r.value for r in poll_until(consumer, 3)] == values(3, b"new-")
    assert (len(warnings("is gone")), len(warnings("is back"))) == (1, 1), caplog.messages


def poll_until_rows(consumer: Consumer, expected: int, timeout_s: float = 20.0) -> pa.Table:
    tables = []
    deadline = time.monotonic() + timeout_s
    while sum(t.num_rows for t in tables) < expected and time.monotonic() < deadline:
        tables.append(consumer.poll_arrow(timeout_ms=200))
    table = pa.concat_tables(tables)
    assert table.num_rows == expected
    return table


def test_a_compacted_batch_keeps_its_offsets_through_poll_and_poll_arrow(broker_factory, consumers):
    """A body with offset deltas (what compaction writes) has gaps: records come back at their
    own offsets, the position moves past the last one, and a seek into a gap starts at the next
    record, through both poll() and poll_arrow(). No producer may send such a batch
    (INVALID_RECORD), so it goes into the stopped broker's segment, as the log cleaner leaves one."""
    broker = broker_factory("compacted-read").start()
    topic = "compacted"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    assert broker.stop() == 0
    body = batch_body.make_body([b"a", b"b", b"c"], [b"k1", b"k2", b"k3"], batch_body.now_ms(), offset_deltas=[0, 3, 7])
    with open(broker.log_dir / f"{topic}-0" / f"{0:020d}.log", "ab") as segment:
        segment.write(record.encode_batch(body))
    broker.start()
    produce(broker.bootstrap, topic, [b"after"])

    consumer = consumers(broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    records = []
    deadline = time.monotonic() + 10
    while len(records) < 4 and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (3, b"b"), (7, b"c"), (8, b"after")]
    assert consumer.position((topic, 0)) == 9

    consumer.seek((topic, 0), 2)
    table = pa.concat_tables([consumer.poll_arrow(timeout_ms=2000)])
    while table.num_rows < 3 and time.monotonic() < deadline:
        table = pa.concat_tables([table, consumer.poll_arrow(timeout_ms=200)])
    assert table.column("offset").to_pylist() == [3, 7, 8]
    assert table.column("value").to_pylist() == [b"b", b"c", b"after"]
