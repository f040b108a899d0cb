"""Typed protocol messages against a real broker over raw TCP: requests built with the shared
message types are answered by the split handlers, and the partition entries' leader epoch
(KIP-320) reaches the ReplicaManager: an epoch newer than the partition's gets
UNKNOWN_LEADER_EPOCH per partition and stores nothing, the current one is served."""
from __future__ import annotations

from typing import Any

import pytest

import protocol
from segment_format import batch_body, record
from client import Admin
from common.errors import NONE, InconsistentTopicIdError, UnknownLeaderEpochError
from protocol import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    Message,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    RequestMessage,
    TopicRequest,
)

TOPIC = "epochs"


@pytest.fixture(scope="module")
def server(module_broker_factory):
    return module_broker_factory("typed-requests").start()


def send(client: Any, request: RequestMessage[Any]) -> Message:
    """One typed request over the raw socket; its typed response (top-level errors fail the test)."""
    payload = b"".join(bytes(p) for p in request.payload())  # type: ignore[arg-type]
    control, reply_payload = client.request(request.api_key, request.to_control(), payload)
    assert control["error_code"] == NONE, control
    return request.response_type.from_control(control, memoryview(bytearray(reply_payload)))


@pytest.fixture(scope="module")
def epoch(server) -> int:
    """Partition 0's leader epoch, after creating the topic."""
    with Admin(server.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1)
        [description] = admin.describe_topics([TOPIC])
    return description.partitions[0].leader_epoch


def produce(client: Any, value: bytes, leader_epoch: int) -> Any:
    batch = bytes(record.encode_batch(batch_body.make_body([value])))
    reply = send(client, ProduceRequest((TopicRequest(TOPIC, (ProducePartition(0, (batch,), leader_epoch),)),)))
    assert isinstance(reply, ProduceResponse)
    return reply.topics[0].partitions[0]


def end_offset(client: Any, leader_epoch: int = protocol.NO_LEADER_EPOCH) -> Any:
    reply = send(client, ListOffsetsRequest((TopicRequest(TOPIC, (
        ListOffsetsPartition(0, protocol.LATEST_TIMESTAMP, leader_epoch),)),)))
    assert isinstance(reply, ListOffsetsResponse)
    return reply.topics[0].partitions[0]


@pytest.mark.slow
def test_produce_with_a_newer_leader_epoch_is_refused_and_stores_nothing(server, raw_client, epoch):
    """A produce naming epoch+1 gets UNKNOWN_LEADER_EPOCH for its partition; the current epoch
    (and no epoch) append."""
    client = raw_client(server.port)
    before = end_offset(client).offset
    refused = produce(client, b"from-the-future", epoch + 1)
    assert isinstance(refused.error(), UnknownLeaderEpochError) and refused.base_offset == -1
    assert end_offset(client).offset == before
    assert produce(client, b"current", epoch).base_offset == before
    assert produce(client, b"unchecked", protocol.NO_LEADER_EPOCH).base_offset == before + 1


def test_fetch_and_list_offsets_check_the_leader_epoch(server, raw_client, epoch):
    """Fetch and ListOffsets entries with epoch+1 get UNKNOWN_LEADER_EPOCH and no data; with the
    current epoch they are served (the fetch returns the records as one slice of the payload)."""
    client = raw_client(server.port)
    produce(client, b"readable", epoch)

    def fetch(leader_epoch: int) -> Any:
        reply = send(client, FetchRequest((TopicRequest(TOPIC, (FetchPartition(0, 0, None, leader_epoch),)),), 0, 0))
        assert isinstance(reply, FetchResponse)
        return reply.topics[0].partitions[0]

    stale = fetch(epoch + 1)
    assert isinstance(stale.error(), UnknownLeaderEpochError) and bytes(stale.records) == b""
    served = fetch(epoch)
    assert served.error() is None and served.high_watermark >= 1
    values = [v for pos, header in record.iter_batches(served.records)
              for v in record.decode_body(served.records, header, pos).column("value").to_pylist()]
    assert b"readable" in values
    assert isinstance(end_offset(client, epoch + 1).error(), UnknownLeaderEpochError)
    assert end_offset(client, epoch).error() is None


def test_fetch_with_a_topic_id_reads_only_that_incarnation(server, raw_client, epoch):
    """A fetch naming the topic's id is served, one naming another id (a deleted incarnation's)
    gets INCONSISTENT_TOPIC_ID and no records, and one without an id (an old client) is served."""
    client = raw_client(server.port)
    produce(client, b"this-incarnation", epoch)
    with Admin(server.bootstrap) as admin:
        [description] = admin.describe_topics([TOPIC])

    def fetch(topic_id: str | None) -> Any:
        reply = send(client, FetchRequest((TopicRequest(TOPIC, (FetchPartition(0, 0),), topic_id),), 0, 0))
        assert isinstance(reply, FetchResponse)
        return reply.topics[0].partitions[0]

    other = fetch("0" * 32)
    assert isinstance(other.error(), InconsistentTopicIdError) and bytes(other.records) == b""
    assert description.topic_id in str(other.error()) and "0" * 32 in str(other.error())
    for topic_id in (description.topic_id, None):
        served = fetch(topic_id)
        assert served.error() is None and bytes(served.records)
