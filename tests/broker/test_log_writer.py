"""The log writer thread (broker/log_writer.py) over a real broker: large appends are queued on it,
and a partition's appends still happen in arrival order, whatever mix of sizes is pipelined and
however small the queue's byte budget."""
from __future__ import annotations

import pytest

from common.errors import NONE, CorruptMessageError
from tests.helpers.raw_produce import batch, create_topic, produce_frame, send_pipelined, values_of

OFFLOAD_BYTES = 4096


@pytest.fixture(params=[64 << 20, 1], ids=["queue-64MiB", "queue-1B"])
def broker(broker_factory, request):
    """A broker that queues appends of OFFLOAD_BYTES or more; with a 1-byte queue budget every
    queued append first waits for the one before it (the backpressure path)."""
    return broker_factory(**{"log.writer.offload.bytes": OFFLOAD_BYTES, "log.writer.queued.max.bytes": request.param}).start()


def test_pipelined_large_and_small_appends_keep_arrival_order_per_partition(broker, raw_client):
    """Large produces (queued on the writer) interleaved with small ones (inline if nothing is
    queued for their partition) in one write: each partition's records are stored in the order
    the requests arrived, and every response carries the base offset that order implies."""
    with raw_client(broker.port) as client:
        create_topic(client, "mixed", 2)
        plan = []  # (partition, tag, count, value bytes) in arrival order
        for i in range(12):
            large = i % 3 == 0
            plan.append((i % 2, f"r{i}", 40 if large else 2, 400 if large else 10))
        frames = [produce_frame(client, [("mixed", p, batch(tag, n, size))]) for p, tag, n, size in plan]
        assert any(len(f) > OFFLOAD_BYTES for _, f in frames) and any(len(f) < OFFLOAD_BYTES for _, f in frames)
        replies = send_pipelined(client, frames)
        for p in range(2):
            expected_values, expected_bases, offset = [], [], 0
            for (cid, _), (partition, tag, n, _) in zip(frames, plan):
                if partition == p:
                    expected_values += [f"{tag}-{j}" for j in range(n)]
                    entry = replies[cid]["topics"][0]["partitions"][0]
                    assert entry["error_code"] == NONE, replies[cid]
                    expected_bases.append((entry["base_offset"], offset))
                    offset += n
            assert values_of(client, "mixed", p) == expected_values
            assert all(got == want for got, want in expected_bases), expected_bases


def test_one_request_spanning_queued_and_inline_partitions_answers_every_partition(broker, raw_client):
    """A request with a large record set for one partition and a small one for another answers
    both once both are appended."""
    with raw_client(broker.port) as client:
        create_topic(client, "spanning", 2)
        _, frame = produce_frame(client, [("spanning", 0, batch("big", 50, 500)), ("spanning", 1, batch("small", 1, 5))])
        client.send_raw(frame)
        _, reply, _ = client.recv_response()
        entries = {e["partition"]: e for e in reply["topics"][0]["partitions"]}
        assert {p: (e["error_code"], e["base_offset"]) for p, e in entries.items()} == {0: (NONE, 0), 1: (NONE, 0)}
        assert values_of(client, "spanning", 0) == [f"big-{j}" for j in range(50)]
        assert values_of(client, "spanning", 1) == ["small-0"]


def test_a_corrupt_queued_append_fails_alone_and_stores_nothing(broker, raw_client):
    """A large batch with a bad CRC fails on the writer thread with CORRUPT_MESSAGE; the appends
    pipelined after it to the same partition succeed and take the offsets it did not use."""
    with raw_client(broker.port) as client:
        create_topic(client, "corrupt", 1)
        bad = bytearray(batch("bad", 40, 400))
        bad[-1] ^= 0xFF
        frames = [produce_frame(client, [("corrupt", 0, bytes(bad))]),
                  produce_frame(client, [("corrupt", 0, batch("after", 3, 10))]),
                  produce_frame(client, [("corrupt", 0, batch("large-after", 40, 400))])]
        replies = send_pipelined(client, frames)
        outcomes = [replies[cid]["topics"][0]["partitions"][0] for cid, _ in frames]
        assert [(o["error_code"], o["base_offset"]) for o in outcomes] == [
            (CorruptMessageError.code, -1), (NONE, 0), (NONE, 3)]
        assert values_of(client, "corrupt", 0) == [f"after-{j}" for j in range(3)] + [f"large-after-{j}" for j in range(40)]


@pytest.mark.slow
def test_clean_stop_with_appends_queued_loses_no_acknowledged_record(broker, raw_client):
    """SIGTERM while a burst of large produces is still queued: the broker exits 0, and after a
    restart the log holds whole batches in arrival order, including every one acknowledged."""
    with raw_client(broker.port) as client:
        create_topic(client, "drain", 1)
        frames = [produce_frame(client, [("drain", 0, batch(f"b{i}", 100, 1000))]) for i in range(20)]
        client.send_raw(b"".join(data for _, data in frames))
        acknowledged = set()
        try:
            first_cid, control, _ = client.recv_response()
            acknowledged.add(first_cid)
            assert broker.stop() == 0
            while True:
                cid, control, _ = client.recv_response()
                assert control["topics"][0]["partitions"][0]["error_code"] == NONE, control
                acknowledged.add(cid)
        except ConnectionError:
            pass
    broker.start()
    with raw_client(broker.port) as client:
        stored = values_of(client, "drain", 0)
    batches = len(stored) // 100
    assert stored == [f"b{i}-{j}" for i in range(batches) for j in range(100)]
    assert {cid for cid, _ in frames[:batches]} >= acknowledged
