"""A client forging producer ids cannot grow a partition's producer state without bound
(producer.state.max.producers.per.partition): the least recently active producers are forgotten
first, a producer that keeps sending keeps its deduplication, and other clients are answered
meanwhile."""
from __future__ import annotations

from common.errors import NONE
from protocol import ApiKey
from segment_format import batch_body, record
from tests.hostile.probe import Probe

TOPIC = "forged-producers"
MAX_PRODUCERS = 100
FLOOD_REQUESTS = 30
BATCHES_PER_REQUEST = 50  # 1,500 forged producer ids: 15 times the bound


def _batch(producer_id: int, sequence: int, age_ms: int = 0) -> bytes:
    """A one-record batch; `age_ms` old (producers are ranked by their last batch's timestamp)."""
    body = batch_body.make_body([b"x"], timestamps_ms=batch_body.now_ms() - age_ms)
    return bytes(record.encode_batch(body, producer_id=producer_id, producer_epoch=0, base_sequence=sequence))


def _produce(client, payload: bytes) -> dict:
    reply, _ = client.request(ApiKey.PRODUCE, {"acks": 1, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
    return reply["topics"][0]["partitions"][0]


def test_forged_producer_ids_evict_the_least_recently_active_and_others_are_served(broker_factory, raw_client):
    broker = broker_factory(**{"producer.state.max.producers.per.partition": MAX_PRODUCERS}).start()
    client = raw_client(broker.port, timeout_s=60)
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": TOPIC, "num_partitions": 1, "replication_factor": 1}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    first = _produce(client, _batch(1, 0, age_ms=120_000))  # the least recently active of all
    assert first["error_code"] == NONE
    with Probe(broker.port, TOPIC) as probe:
        for request in range(FLOOD_REQUESTS):
            forged = range(1_000 + request * BATCHES_PER_REQUEST, 1_000 + (request + 1) * BATCHES_PER_REQUEST)
            answer = _produce(client, b"".join(_batch(pid, 0, age_ms=60_000) for pid in forged))
            assert answer["error_code"] == NONE, answer
            # The producer that keeps sending stays among the most recently active.
            assert _produce(client, _batch(2, request))["error_code"] == NONE
    assert probe.worst_s < 10, f"another client waited {probe.worst_s:.1f} s during the flood"
    last_of_active = 1 + FLOOD_REQUESTS * (BATCHES_PER_REQUEST + 1) - 1
    retry_of_active = _produce(client, _batch(2, FLOOD_REQUESTS - 1))
    assert retry_of_active["base_offset"] == last_of_active  # a duplicate: its original offset
    end = _produce(client, _batch(3, 0))["base_offset"]
    assert end == last_of_active + 1  # the retry wrote nothing
    retry_of_idle = _produce(client, _batch(1, 0, age_ms=120_000))
    assert retry_of_idle["base_offset"] == end + 1  # forgotten: appended again, the bound held
