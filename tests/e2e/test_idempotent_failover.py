"""The producer state replicates: on a 3-broker cluster, idempotent batches are acknowledged with
acks=all, the partition's leader is SIGKILLed, and the new leader answers retries of the last
acknowledged batches with their original offsets (nothing written twice), then takes the next
sequence. Batches are sent over the raw protocol, as a producer's retry would be."""
from __future__ import annotations

from client import Admin
from common.errors import NONE
from protocol import ApiKey
from segment_format import batch_body, record
from tests.helpers.cluster_scenarios import partitions_of, wait_for, wait_for_full_isr
from tests.helpers.raw_client import RawClient
from tests.helpers.raw_produce import values_of

TOPIC = "idempotent-failover"
PRODUCER = 77
RECORDS = 5  # per batch
BATCHES = 40


def _batch(sequence: int) -> bytes:
    values = [f"s{sequence + i}".encode() for i in range(RECORDS)]
    return bytes(record.encode_batch(batch_body.make_body(values, timestamps_ms=batch_body.now_ms()),
                                     producer_id=PRODUCER, producer_epoch=0, base_sequence=sequence))


def _produce(client: RawClient, payload: bytes) -> dict:
    reply, _ = client.request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 10_000, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
    return reply["topics"][0]["partitions"][0]


def test_a_new_leader_answers_retries_of_the_old_leaders_batches_with_their_offsets(cluster):
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2, "segment.bytes": 4096})
        leader = wait_for_full_isr(admin, TOPIC)[0].leader
    old = local.brokers[leader]
    acknowledged = {}
    with RawClient(old.port, host=old.host, timeout_s=30) as client:
        for i in range(BATCHES):
            answer = _produce(client, _batch(i * RECORDS))
            assert answer["error_code"] == NONE, answer
            acknowledged[i * RECORDS] = answer["base_offset"]
    old.kill()
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not old)
    with Admin(survivors, request_timeout_ms=5_000) as admin:
        moved = wait_for(lambda: (lambda p: p if p.leader not in (-1, leader) else None)(
            partitions_of(admin, TOPIC)[0]), 60, "a new leader of the partition")
    new = local.brokers[moved.leader]
    with RawClient(new.port, host=new.host, timeout_s=30) as client:
        def retried(sequence: int) -> dict | None:
            answer = _produce(client, _batch(sequence))
            return answer if answer["error_code"] == NONE else None  # NOT_LEADER until it has taken over

        for sequence in sorted(acknowledged)[-5:]:  # the last five: a producer's requests in flight
            answer = wait_for(lambda: retried(sequence), 60, f"the new leader's answer to a retry of {sequence}")
            assert answer["base_offset"] == acknowledged[sequence], (sequence, answer)
        following = _produce(client, _batch(BATCHES * RECORDS))
        assert following["error_code"] == NONE and following["base_offset"] == BATCHES * RECORDS, following
        wait_for(lambda: len(values_of(client, TOPIC, 0)) == (BATCHES + 1) * RECORDS, 60, "the high watermark")
        assert values_of(client, TOPIC, 0) == [f"s{i}" for i in range((BATCHES + 1) * RECORDS)]
