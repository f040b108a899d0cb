"""Producer against a real broker process: offsets, partitioning, headers, compression, acks,
linger, the columnar send_batch path, errors, retries across an outage, delivery timeout, close."""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import Admin, AsyncProducer, Consumer, ConsumerRecord, Producer
from client.partitioner import partition_for_key
from tests.helpers.client_records import consume
from tests.waiting import wait_until
from common.errors import (
    DeliveryTimeoutError,
    MessageTooLargeError,
    ProducerClosedError,
    UnknownTopicOrPartitionError,
)


# -- offsets and partitions --------------------------------------------------------------------


def test_send_futures_give_consecutive_offsets_per_partition(shared_broker, new_topic):
    """Keyed sends over 3 partitions: each partition's futures carry offsets 0..n-1 in send order."""
    topic = new_topic(3)
    with Producer(shared_broker.bootstrap) as producer:
        futures = [producer.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(60)]
        producer.flush()
    metadata = [f.result(10) for f in futures]
    for p in range(3):
        offsets = [m.offset for m in metadata if m.partition == p]
        assert offsets == list(range(len(offsets)))
    assert all(m.partition == partition_for_key(b"k%d" % i, 3, "murmur2") for i, m in enumerate(metadata))  # a new topic: Kafka's placement
    records = consume(shared_broker.bootstrap, topic, 3, 60)
    assert {(r.partition, r.offset): r.value for r in records} == {(m.partition, m.offset): b"v%d" % i for i, m in enumerate(metadata)}


def test_offsets_stay_distinct_when_one_request_carries_several_batches_of_a_partition(shared_broker, new_topic):
    """20 one-record batches of partition 0 sealed before the sender runs get offsets 0..19, not 19 twenty times."""
    topic = new_topic(1)

    async def produce() -> list[int]:
        async with AsyncProducer(shared_broker.bootstrap, batch_size=50) as producer:
            # No await yields to the sender between sends: every batch is sealed before it drains,
            # so all 20 go out in one request.
            futures = [await producer.send(topic, b"x" * 40, partition=0) for _ in range(20)]
            await producer.flush()
            return [(await f).offset for f in futures]

    offsets = asyncio.run(asyncio.wait_for(produce(), 30))
    assert offsets == list(range(20))


def test_send_to_explicit_partition_lands_there(shared_broker, new_topic):
    """partition=2 overrides the key hash: every record is stored in partition 2."""
    topic = new_topic(3)
    with Producer(shared_broker.bootstrap) as producer:
        futures = [producer.send(topic, b"v", key=b"k%d" % i, partition=2) for i in range(10)]
        producer.flush()
    assert [f.result().partition for f in futures] == [2] * 10
    assert [f.result().offset for f in futures] == list(range(10))
    assert {r.partition for r in consume(shared_broker.bootstrap, topic, 3, 10)} == {2}


def test_null_key_records_stick_to_one_partition_until_the_batch_is_sealed(shared_broker, new_topic):
    """KIP-480: 20 null-key records sent within one linger window all go to one partition."""
    topic = new_topic(3)
    with Producer(shared_broker.bootstrap, linger_ms=1000, batch_size=1 << 20) as producer:
        futures = [producer.send(topic, b"v%d" % i) for i in range(20)]
        producer.flush()
    assert len({f.result().partition for f in futures}) == 1


# -- record contents ---------------------------------------------------------------------------


def test_headers_round_trip_through_send_and_consumer(shared_broker, new_topic):
    """Headers given as [(str, bytes)] come back equal on the consumer; records without headers get None."""
    topic = new_topic(1)
    sent = [
        [("trace-id", b"abc"), ("empty", b""), ("utf8-\u00e9", b"\x00\xff")],
        None,
        [],
        [("dup", b"1"), ("dup", b"2")],
    ]
    with Producer(shared_broker.bootstrap) as producer:
        for i, headers in enumerate(sent):
            producer.send(topic, b"v%d" % i, headers=headers)
        producer.flush()
    records = sorted(consume(shared_broker.bootstrap, topic, 1, len(sent)), key=lambda r: r.offset)
    assert [r.headers for r in records] == [sent[0], None, [], sent[3]]


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"], ids=["none", "lz4", "zstd"])
def test_compressed_batches_round_trip(shared_broker, new_topic, compression):
    """Records sent one by one and columnar with each compression come back byte for byte."""
    topic = new_topic(1)
    values = [(b"payload-%d " % i) * 50 for i in range(40)]
    with Producer(shared_broker.bootstrap, compression=compression) as producer:
        for i, value in enumerate(values[:20]):
            producer.send(topic, value, key=b"k%d" % i, timestamp_ms=1_000 + i)
        producer.flush()
        producer.send_batch(topic, pa.table({"value": values[20:]}), timestamp_ms=5_000)
        producer.flush()
    records = sorted(consume(shared_broker.bootstrap, topic, 1, 40), key=lambda r: r.offset)
    assert [r.value for r in records] == values
    assert [r.key for r in records] == [b"k%d" % i for i in range(20)] + [None] * 20
    assert [r.timestamp for r in records] == [1_000 + i for i in range(20)] + [5_000] * 20


# -- acks and timing ---------------------------------------------------------------------------


def test_acks_zero_reports_offset_minus_one_and_records_still_arrive(shared_broker, new_topic):
    """With acks=0 the broker sends no response: metadata offsets are -1, the records are stored anyway."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, acks=0) as producer:
        futures = [producer.send(topic, b"v%d" % i) for i in range(10)]
        producer.flush()
    assert [f.result(10).offset for f in futures] == [-1] * 10
    records = consume(shared_broker.bootstrap, topic, 1, 10)
    assert sorted(r.value for r in records) == sorted(b"v%d" % i for i in range(10))


def test_acks_all_is_acknowledged_by_a_single_broker(shared_broker, new_topic):
    """acks='all' on a one-broker cluster (ISR = leader) acknowledges with real offsets."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, b"v%d" % i) for i in range(5)]
        producer.flush()
    assert [f.result(10).offset for f in futures] == list(range(5))


def test_single_send_waits_for_linger_when_batch_is_not_full(shared_broker, new_topic):
    """linger_ms=200 with a huge batch_size: a lone record is acknowledged only after ~200 ms."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, linger_ms=200, batch_size=1 << 24) as producer:
        producer.send(topic, b"warm-up").result(10)  # connections open before timing
        start = time.monotonic()
        future = producer.send(topic, b"v")
        future.result(10)
        elapsed = time.monotonic() - start
    assert 0.150 <= elapsed < 2.0, elapsed


def test_full_batch_is_sent_without_waiting_for_linger(shared_broker, new_topic):
    """linger_ms=200 with a tiny batch_size: the record fills its batch and is sent at once."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap, linger_ms=200, batch_size=1) as producer:
        producer.send(topic, b"warm-up").result(10)
        start = time.monotonic()
        producer.send(topic, b"v").result(10)
        elapsed = time.monotonic() - start
    assert elapsed < 0.150, elapsed


# -- columnar send_batch -----------------------------------------------------------------------

ROWS = 30
BASE_TS = 1_700_000_000_000


def batch_rows(text: bool) -> tuple[list, list]:
    """Keys (every third one null) and values, as str or bytes."""
    keys = [None if i % 3 == 0 else f"key-{i}" for i in range(ROWS)]
    values = [f"value-{i}" for i in range(ROWS)]
    if not text:
        keys = [None if k is None else k.encode() for k in keys]
        values = [v.encode() for v in values]
    return keys, values


def build_input(container: str, text: bool, with_timestamp: bool):
    keys, values = batch_rows(text)
    kind = pa.string() if text else pa.binary()
    columns = {"key": pa.array(keys, kind), "value": pa.array(values, kind)}
    if with_timestamp:
        columns["timestamp"] = pa.array([BASE_TS + i for i in range(ROWS)], pa.timestamp("ms"))
    table = pa.table(columns)
    if container == "table":
        return table
    if container == "record_batch":
        return table.to_batches()[0]
    frame = pd.DataFrame({"key": keys, "value": values})
    if with_timestamp:
        frame["timestamp"] = pd.to_datetime([BASE_TS + i for i in range(ROWS)], unit="ms")
    return frame


@pytest.mark.parametrize("with_timestamp", [False, True], ids=["now", "timestamp-column"])
@pytest.mark.parametrize("text", [False, True], ids=["bytes", "str"])
@pytest.mark.parametrize("container", ["table", "record_batch", "dataframe"])
def test_send_batch_delivers_every_row(shared_broker, new_topic, container, text, with_timestamp):
    """Table / RecordBatch / DataFrame with str or bytes columns: keyed rows hash to their partition,
    null-key rows spread over partitions in batch_size chunks, timestamps come from the column or now."""
    topic = new_topic(3)
    before = int(time.time() * 1000)
    with Producer(shared_broker.bootstrap, batch_size=1) as producer:  # one row per chunk: null keys spread
        results = producer.send_batch(topic, build_input(container, text, with_timestamp))
        producer.flush()
    after = int(time.time() * 1000)
    assert results and all(r.done() and r.error is None for r in results)
    records = consume(shared_broker.bootstrap, topic, 3, ROWS)
    by_value = {r.value: r for r in records}
    keys, values = batch_rows(text=False)
    assert sorted(by_value) == sorted(values)
    for i, (key, value) in enumerate(zip(keys, values)):
        got = by_value[value]
        assert got.key == key
        if key is not None:
            assert got.partition == partition_for_key(key, 3, "murmur2")
        if with_timestamp:
            assert got.timestamp == BASE_TS + i
        else:
            assert before <= got.timestamp <= after
    assert len({by_value[v].partition for k, v in zip(keys, values) if k is None}) > 1


def test_send_batch_to_explicit_partition_keeps_every_row_there(shared_broker, new_topic):
    """send_batch(partition=1) ignores keys: keyed and null-key rows all land in partition 1, in order."""
    topic = new_topic(3)
    keys, values = batch_rows(text=False)
    with Producer(shared_broker.bootstrap) as producer:
        results = producer.send_batch(topic, pa.table({"key": pa.array(keys, pa.binary()), "value": values}), partition=1)
        producer.flush()
    assert all(r.error is None and r.partition == 1 for r in results)
    records = sorted(consume(shared_broker.bootstrap, topic, 3, ROWS), key=lambda r: r.offset)
    assert {r.partition for r in records} == {1}
    assert [r.value for r in records] == values


def test_send_batch_truncates_sub_millisecond_timestamps(shared_broker, new_topic):
    """A pandas datetime column with microseconds (e.g. from Timestamp.now()) is sent, truncated to ms."""
    topic = new_topic(1)
    stamp = pd.Timestamp("2024-01-02 03:04:05.006789")
    with Producer(shared_broker.bootstrap) as producer:
        producer.send_batch(topic, pd.DataFrame({"value": [b"v"], "timestamp": [stamp]}))
        producer.flush()
    [got] = consume(shared_broker.bootstrap, topic, 1, 1)
    assert got.timestamp == stamp.value // 1_000_000


# -- send order across send() and send_batch() --------------------------------------------------


class Call(NamedTuple):
    """One call a send-order test hands the producer: send() of one record or send_batch() of
    `rows` rows, to an explicit partition; `step` numbers the calls of a test, in call order."""

    step: int
    kind: str  # "send" or "send_batch"
    partition: int
    rows: int

    @property
    def values(self) -> list[bytes]:
        return [b"%d-%d" % (self.step, row) for row in range(self.rows)]

    def args(self, topic: str) -> tuple[str, Any]:
        values = self.values
        return topic, values[0] if self.kind == "send" else pa.table({"value": pa.array(values, pa.binary())})


def numbered(sequences: Iterable[Iterable[tuple[str, int, int]]]) -> list[list[Call]]:
    """Sequences of (kind, partition, rows) as Calls numbered across all of them."""
    steps = itertools.count()
    return [[Call(next(steps), *op) for op in ops] for ops in sequences]


def produce_in_sequences(api: str, bootstrap: str, settings: dict[str, Any], topic: str,
                         sequences: list[list[Call]]) -> list[list[Any]]:
    """Make each sequence's calls on one producer, flushing after each sequence; what every call
    returned (a RecordFuture or send_batch's BatchResults), by sequence."""
    if api == "sync":
        with Producer(bootstrap, **settings) as producer:
            returned = []
            for calls in sequences:
                returned.append([getattr(producer, c.kind)(*c.args(topic), partition=c.partition) for c in calls])
                producer.flush()
            return returned

    async def produce() -> list[list[Any]]:
        async with AsyncProducer(bootstrap, **settings) as producer:
            returned = []
            for calls in sequences:
                returned.append([await getattr(producer, c.kind)(*c.args(topic), partition=c.partition) for c in calls])
                await producer.flush()
            return returned

    return asyncio.run(asyncio.wait_for(produce(), 120))


def landed_at(returned: Any, rows: int) -> list[int]:
    """The offsets of a call's records: its future's, or those of send_batch's one batch."""
    if isinstance(returned, list):  # these few rows make one batch
        (result,) = returned
        if result.error is not None:
            raise result.error
        return list(range(result.base_offset, result.base_offset + rows))
    return [returned.result(10).offset]


def assert_call_order(bootstrap: str, topic: str, partitions: int, sequences: list[list[Call]],
                      returned: list[list[Any]]) -> None:
    """Each partition's records hold offsets 0, 1, ... in the order of the calls that handed them
    over, as the producer reported them and as the log holds them."""
    next_offset = [0] * partitions
    expected: dict[tuple[int, int], bytes] = {}
    for calls, results in zip(sequences, returned):
        for call, result in zip(calls, results):
            start = next_offset[call.partition]
            offsets = list(range(start, start + call.rows))
            assert landed_at(result, call.rows) == offsets, f"{call} in {calls}"
            next_offset[call.partition] += call.rows
            expected.update(((call.partition, offset), value) for offset, value in zip(offsets, call.values))
    records = consume(bootstrap, topic, partitions, len(expected))
    assert {(r.partition, r.offset): r.value for r in records} == expected


ORDER_OPS = [("send", p, 1) for p in range(2)] + [("send_batch", p, 2) for p in range(2)]


@pytest.mark.parametrize("linger_ms", [0, None], ids=["linger-0", "default-linger"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_send_and_send_batch_keep_call_order_within_a_partition(shared_broker, new_topic, api, linger_ms):
    """Every sequence of one to three send()/send_batch() calls over two partitions, flushed after
    each sequence: a partition's records take offsets in call order, whichever API handed them over."""
    topic = new_topic(2)
    sequences = numbered(ops for length in (1, 2, 3) for ops in itertools.product(ORDER_OPS, repeat=length))
    settings = {} if linger_ms is None else {"linger_ms": linger_ms}
    returned = produce_in_sequences(api, shared_broker.bootstrap, settings, topic, sequences)
    assert_call_order(shared_broker.bootstrap, topic, 2, sequences, returned)


ORDER_OP = st.one_of(st.tuples(st.just("send"), st.integers(0, 2), st.just(1)),
                     st.tuples(st.just("send_batch"), st.integers(0, 2), st.integers(1, 3)))


def test_random_interleavings_of_send_and_send_batch_keep_call_order(shared_broker, new_topic):
    """Random runs of send()/send_batch() calls over three partitions, flushed at random points,
    either API, linger 0 or 5 ms: a partition's records take offsets in call order."""

    @settings(max_examples=20)
    @given(ops=st.lists(st.lists(ORDER_OP, min_size=1, max_size=6), min_size=1, max_size=3),
           api=st.sampled_from(["sync", "async"]), linger_ms=st.sampled_from([0, 5]))
    def calls_keep_order(ops: list[list[tuple[str, int, int]]], api: str, linger_ms: int) -> None:
        topic = new_topic(3)
        sequences = numbered(ops)
        returned = produce_in_sequences(api, shared_broker.bootstrap, {"linger_ms": linger_ms}, topic, sequences)
        assert_call_order(shared_broker.bootstrap, topic, 3, sequences, returned)

    calls_keep_order()


# -- errors ------------------------------------------------------------------------------------


def test_send_to_unknown_topic_raises(shared_broker):
    """send and send_batch to a topic that does not exist raise UnknownTopicOrPartitionError."""
    with Producer(shared_broker.bootstrap) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("no-such-topic", b"v")
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send_batch("no-such-topic", pa.table({"value": [b"v"]}))


@pytest.mark.parametrize("partition", [-1, 3, 100], ids=["negative", "count", "far"])
def test_partition_out_of_range_raises_value_error(shared_broker, new_topic, partition):
    """An explicit partition outside 0..count-1 is refused by send and send_batch before anything is queued."""
    topic = new_topic(3)
    with Producer(shared_broker.bootstrap) as producer:
        with pytest.raises(ValueError):
            producer.send(topic, b"v", partition=partition)
        with pytest.raises(ValueError):
            producer.send_batch(topic, pa.table({"value": [b"v"]}), partition=partition)


@pytest.mark.parametrize(
    "value, key",
    [("text", None), (12, None), ({"a": 1}, None), (b"v", "text-key"), (b"v", 7)],
    ids=["str-value", "int-value", "dict-value", "str-key", "int-key"],
)
def test_non_bytes_value_or_key_raises_type_error(shared_broker, new_topic, value, key):
    """Values and keys must be bytes-like or None: anything else raises TypeError at send."""
    topic = new_topic(1)
    with Producer(shared_broker.bootstrap) as producer:
        with pytest.raises(TypeError):
            producer.send(topic, value, key=key)


def test_batch_above_max_message_bytes_fails_fast_with_message_too_large(shared_broker, new_topic):
    """A batch over the topic's max.message.bytes fails its future (not retried), and the producer goes on."""
    topic = new_topic(1, {"max.message.bytes": 4096})  # an empty Arrow batch is ~1 KiB
    with Producer(shared_broker.bootstrap, delivery_timeout_ms=60_000) as producer:
        start = time.monotonic()
        future = producer.send(topic, b"x" * 10_000)
        with pytest.raises(MessageTooLargeError):
            future.result(10)
        assert time.monotonic() - start < 5
        assert producer.send(topic, b"small").result(10).offset == 0


# -- on_delivery callbacks ----------------------------------------------------------------------


def test_on_delivery_is_called_once_per_record_in_offset_order_on_the_io_thread(shared_broker, new_topic):
    """Every record's callback runs exactly once, with the metadata its future gives, on the
    producer's I/O thread, in offset order per partition; records without a callback in the
    same batches are left alone."""
    import threading

    topic = new_topic(3)
    calls: list[tuple[int, object, object, str]] = []

    def callback_for(i: int):
        return lambda metadata, error: calls.append((i, metadata, error, threading.current_thread().name))

    with Producer(shared_broker.bootstrap, linger_ms=20) as producer:
        futures = [producer.send(topic, b"v%d" % i, key=b"k%d" % i, on_delivery=callback_for(i) if i % 3 else None)
                   for i in range(300)]
        producer.flush()
        results = [f.result(10) for f in futures]
    assert sorted(i for i, *_ in calls) == [i for i in range(300) if i % 3]
    assert all(error is None for _, _, error, _ in calls)
    assert {thread for *_, thread in calls} == {"pymq-producer"}
    assert all(metadata == results[i] for i, metadata, _, _ in calls)
    for p in range(3):
        offsets = [m.offset for _, m, _, _ in calls if m.partition == p]
        assert offsets == sorted(offsets) and offsets


def test_on_delivery_reports_a_failed_record_with_its_error(shared_broker, new_topic):
    """A record the broker rejects (over max.message.bytes): its callback gets offset -1 and the
    error, and its future raises the same error."""
    topic = new_topic(1, {"max.message.bytes": 4096})
    calls: list[tuple[object, object]] = []
    with Producer(shared_broker.bootstrap) as producer:
        future = producer.send(topic, b"x" * 10_000, on_delivery=lambda m, e: calls.append((m, e)))
        producer.flush()
        with pytest.raises(MessageTooLargeError) as raised:
            future.result(10)
    [(metadata, error)] = calls
    assert error is raised.value
    assert (metadata.topic, metadata.partition, metadata.offset) == (topic, 0, -1)


def test_a_raising_callback_is_logged_and_the_others_still_run(shared_broker, new_topic, caplog):
    topic = new_topic(1)
    seen: list[int] = []

    def bad(metadata, error):
        raise RuntimeError("application bug")

    with Producer(shared_broker.bootstrap, linger_ms=50) as producer:
        producer.send(topic, b"a", on_delivery=lambda m, e: seen.append(m.offset))
        producer.send(topic, b"b", on_delivery=bad)
        last = producer.send(topic, b"c", on_delivery=lambda m, e: seen.append(m.offset))
        producer.flush()
        assert last.result(10).offset == 2
    assert seen == [0, 2]
    assert "on_delivery callback" in caplog.text and "application bug" in caplog.text


def test_flush_inside_a_callback_raises_instead_of_deadlocking(shared_broker, new_topic):
    """flush() called on the I/O thread would wait for itself: it raises RuntimeError at once."""
    topic = new_topic(1)
    outcome: list[BaseException] = []
    with Producer(shared_broker.bootstrap) as producer:

        def flush_from_callback(metadata, error):
            try:
                producer.flush()
            except RuntimeError as err:
                outcome.append(err)

        producer.send(topic, b"v", on_delivery=flush_from_callback).result(10)
        producer.flush()
    assert len(outcome) == 1 and "own I/O thread" in str(outcome[0])


def test_async_producer_on_delivery_runs_on_its_loop(shared_broker, new_topic):
    topic = new_topic(1)

    async def produce() -> list[tuple[int, object]]:
        calls = []
        async with AsyncProducer(shared_broker.bootstrap) as producer:
            loop = asyncio.get_running_loop()
            for i in range(5):
                await producer.send(topic, b"v%d" % i, on_delivery=lambda m, e: calls.append(
                    (m.offset, e, asyncio.get_running_loop() is loop)))
            await producer.flush()
        return calls

    assert asyncio.run(produce()) == [(i, None, True) for i in range(5)]


# -- failures of the broker --------------------------------------------------------------------


def test_records_sent_during_an_outage_are_delivered_after_restart(broker_factory):
    """Broker stopped, 10 records sent, broker restarted on its port: all are acknowledged and stored."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("outage", partitions=1)
    with Producer(broker.bootstrap, delivery_timeout_ms=30_000, retry_backoff_max_ms=200) as producer:
        assert producer.send("outage", b"before").result(10).offset == 0
        broker.stop()
        futures = [producer.send("outage", b"during-%d" % i) for i in range(10)]
        wait_until(lambda: producer.metrics()["record-retry-total"] >= 30, 30,
                   "the sender fails and retries the 10 records three times")
        assert not any(f.done() for f in futures)
        broker.start()
        metadata = [f.result(30) for f in futures]
    assert sorted(m.offset for m in metadata) == list(range(1, 11))
    records = consume(broker.bootstrap, "outage", 1, 11)
    assert sorted(r.value for r in records) == sorted([b"before"] + [b"during-%d" % i for i in range(10)])


def test_records_fail_with_delivery_timeout_when_broker_stays_down(broker_factory):
    """Broker stopped for good, delivery_timeout_ms=1500: futures fail with DeliveryTimeoutError in time."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("down", partitions=1)
    producer = Producer(broker.bootstrap, delivery_timeout_ms=1500)
    try:
        producer.send("down", b"warm-up").result(10)
        broker.stop()
        start = time.monotonic()
        futures = [producer.send("down", b"v%d" % i) for i in range(3)]
        for future in futures:
            with pytest.raises(DeliveryTimeoutError):
                future.result(10)
        assert 1.4 <= time.monotonic() - start < 5
    finally:
        producer.close(timeout_s=1)


def consume_to_end(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> list[ConsumerRecord]:
    """Every record of the topic up to its end offsets (duplicates included)."""
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        expected = sum(consumer.end_offsets(tps).values())
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
        assert len(records) == expected, f"received {len(records)} of {expected} records"
    return records


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "kill"])
@pytest.mark.slow
def test_max_in_flight_one_keeps_each_partitions_order_across_broker_restarts(broker_factory, crash):
    """A thread sends numbered records to 3 partitions (max_in_flight=1, small batches) while the
    broker is stopped (or killed) and restarted twice: requests in flight fail, reconnects are
    refused, batches are retried. Every record is acknowledged and stored, and each partition's
    log holds them in send order (a retry may add a second copy of a batch whose response was
    lost: only first copies are compared)."""
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("ordered", partitions=3)
    futures = []
    stop = threading.Event()
    with Producer(broker.bootstrap, max_in_flight=1, linger_ms=1, batch_size=1000, retry_backoff_ms=20,
                  retry_backoff_max_ms=100, delivery_timeout_ms=60_000) as producer:

        def send_numbered() -> None:
            while not stop.is_set():
                i = len(futures)
                futures.append(producer.send("ordered", b"%d" % i, partition=i % 3))
                if i % 20 == 19:
                    time.sleep(0.002)  # pacing, not a wait: a steady sender, not a flood filling buffer_memory

        def acknowledged() -> int:
            return sum(f.done() and f.exception(0) is None for f in list(futures))

        def more_acknowledged() -> None:
            before = acknowledged()
            wait_until(lambda: acknowledged() >= before + 100, 30, "100 more records acknowledged")

        sender = threading.Thread(target=send_numbered)
        sender.start()
        try:
            for _ in range(2):
                more_acknowledged()
                broker.kill() if crash else broker.stop()
                retried = producer.metrics()["record-retry-total"]
                wait_until(lambda: producer.metrics()["record-retry-total"] > retried, 30,
                           "records sent meanwhile are retried against a closed port")
                broker.start()
            more_acknowledged()
        finally:
            stop.set()
            sender.join(10)
        producer.flush(60)
    assert [f.exception(0) for f in futures] == [None] * len(futures)
    records = consume_to_end(broker.bootstrap, "ordered", 3)
    for p in range(3):
        values = [int(r.value) for r in sorted(records, key=lambda r: r.offset) if r.partition == p]
        assert list(dict.fromkeys(values)) == list(range(p, len(futures), 3))


def test_send_blocks_while_buffer_memory_is_full_and_resumes_when_records_complete(broker_factory):
    """Broker down: sends fill buffer_memory, then block; max_block_ms later one raises. A sender
    blocked in send() goes on once the broker is back and acknowledgements free the buffer."""
    import threading

    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("full", partitions=1)
    with Producer(broker.bootstrap, buffer_memory=20_000, max_block_ms=400, linger_ms=0,
                  retry_backoff_max_ms=100, delivery_timeout_ms=30_000) as producer:
        producer.send("full", b"warm-up").result(10)
        broker.stop()
        futures = []
        start = time.monotonic()
        with pytest.raises(DeliveryTimeoutError, match="buffer_memory"):
            for _ in range(1000):
                futures.append(producer.send("full", b"x" * 1000))
        assert 0.3 <= time.monotonic() - start < 5
        assert 10 <= len(futures) <= 20

        unblocked: list[object] = []
        blocked = threading.Thread(target=lambda: unblocked.append(producer.send("full", b"late")))
        producer._core.max_block_s = 30
        blocked.start()
        # What must not happen cannot be waited for: the send stays blocked for 0.3 s of a full buffer.
        time.sleep(0.3)
        assert blocked.is_alive() and not unblocked
        broker.start()
        blocked.join(30)
        assert unblocked and unblocked[0].result(30).offset == len(futures) + 1
        assert [f.result(30).offset for f in futures] == list(range(1, len(futures) + 1))


# -- lifecycle ---------------------------------------------------------------------------------


def test_close_flushes_records_still_lingering(shared_broker, new_topic):
    """close() sends records waiting out a 10 s linger and completes their futures before returning."""
    topic = new_topic(1)
    producer = Producer(shared_broker.bootstrap, linger_ms=10_000)
    futures = [producer.send(topic, b"v%d" % i) for i in range(5)]
    start = time.monotonic()
    producer.close()
    assert time.monotonic() - start < 5
    assert all(f.done() for f in futures)
    assert [f.result(0).offset for f in futures] == list(range(5))
    assert len(consume(shared_broker.bootstrap, topic, 1, 5)) == 5


def test_send_after_close_raises_producer_closed(shared_broker, new_topic):
    """Sending to a topic the producer knows, after close(), raises ProducerClosedError."""
    topic = new_topic(1)
    producer = Producer(shared_broker.bootstrap)
    producer.send(topic, b"v").result(10)
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send(topic, b"late")


def test_send_after_close_to_a_topic_never_used_raises_producer_closed(shared_broker, new_topic):
    """After close(), even a topic the producer never looked up raises ProducerClosedError."""
    producer = Producer(shared_broker.bootstrap)
    topic = new_topic(1)  # created after the producer loaded metadata: not in its cache
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send(topic, b"late")


def test_close_twice_is_harmless(shared_broker):
    """close() after close() (or a `with` block around an explicit close) returns quietly."""
    with Producer(shared_broker.bootstrap) as producer:
        producer.close()


def test_async_producer_futures_can_be_awaited(shared_broker, new_topic):
    """In asyncio code `await producer.send(...)` queues and `await future` gives RecordMetadata."""
    topic = new_topic(2)

    async def produce():
        async with AsyncProducer(shared_broker.bootstrap, linger_ms=1) as producer:
            first = await producer.send(topic, b"a", partition=1)
            second = await producer.send(topic, b"b", partition=1)
            return await first, await second

    first, second = asyncio.run(asyncio.wait_for(produce(), 30))
    assert (first.topic, first.partition, first.offset) == (topic, 1, 0)
    assert (second.partition, second.offset) == (1, 1)


