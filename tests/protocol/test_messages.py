"""Typed protocol messages (protocol/messages): payloads split per partition, and malformed
controls are refused with an InvalidRequestError naming the field, or kept as the error of the one
entry they concern. (The round trip of every message: test_message_schema.py.)"""
from __future__ import annotations

from typing import Any, Callable

import msgpack
import pytest

import protocol
from common.errors import InvalidConfigError, InvalidRequestError, InvalidRequiredAcksError, InvalidTopicError, PymqError
from protocol import (
    REQUEST_TYPES,
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    Message,
    BrokerHandshakeRequest,
    MetadataRequest,
    MetadataResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    TopicRequest,
    TopicResponse,
)


def wire(message: Message) -> tuple[dict[str, Any], memoryview]:
    """The control map and payload a peer receives: msgpack-encoded and decoded as the framing does."""
    packed = msgpack.packb(message.to_control(), use_bin_type=True)
    control = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    payload = bytearray().join(bytes(p) for p in message.payload())  # type: ignore[arg-type]
    return control, memoryview(payload)


def round_trip(message: Message) -> Message:
    return type(message).from_control(*wire(message))


# The round trip of every message is tests/protocol/test_message_schema.py's, with strategies
# derived from each message's declaration.


def test_every_api_has_a_request_message():
    """REQUEST_TYPES and GROUP_REQUEST_TYPES cover every ApiKey."""
    group_keys = {cls.api_key for cls in protocol.GROUP_REQUEST_TYPES}
    assert set(REQUEST_TYPES) | group_keys == set(protocol.ApiKey)


def test_produce_request_joins_a_partitions_buffers_and_splits_the_payload_per_partition():
    """A partition given as several buffers (a batch's header and body) travels as one slice; each
    decoded partition holds a view of its own bytes, writable for the log's offset patching."""
    request = ProduceRequest((TopicRequest("t", (ProducePartition(0, (b"head", b"body")), ProducePartition(1, (b"xyz",)))),))
    control, payload = wire(request)
    assert control["topics"][0]["partitions"][0]["size"] == 8
    decoded = ProduceRequest.from_control(control, payload)
    first, second = decoded.topics[0].partitions
    assert bytes(first.record_set()) == b"headbody" and bytes(second.record_set()) == b"xyz"
    first.record_set()[0:1] = b"H"
    assert bytes(payload[:1]) == b"H", "a decoded partition's records are a view of the payload, not a copy"


def test_fetch_response_payload_skips_empty_partitions_and_decodes_views():
    """Only partitions with bytes put them on the wire; the client gets each partition's own slice."""
    response = FetchResponse((TopicResponse("t", (
        FetchPartitionResponse(0, records=b"abc"), FetchPartitionResponse(1, 3), FetchPartitionResponse(2, records=b"de"))),))
    assert response.payload() == [b"abc", b"de"]
    decoded = FetchResponse.from_control(*wire(response))
    assert [bytes(p.records) for p in decoded.topics[0].partitions] == [b"abc", b"", b"de"]
    assert decoded.topics[0].partitions[1].error() is not None


# -- invalid controls: the whole message is refused --------------------------------------------


def _produce(partitions: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"topics": [{"name": "t", "partitions": partitions}], **fields}


def _fetch(partition: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 0} | partition]}], **fields}


INVALID = [
    # id, message type, control, payload, (error class, words the message must contain)
    ("produce-acks-2", ProduceRequest, _produce([], acks=2), b"", (InvalidRequiredAcksError, "acks must be -1, 0 or 1")),
    ("produce-acks-bool", ProduceRequest, _produce([], acks=True), b"", (InvalidRequestError, "'acks' must not be a bool")),
    ("produce-acks-str", ProduceRequest, _produce([], acks="all"), b"", (InvalidRequestError, "'acks' has type str")),
    ("produce-timeout-negative", ProduceRequest, _produce([], timeout_ms=-1), b"", (InvalidRequestError, "'timeout_ms' must be >= 0")),
    ("produce-topics-missing", ProduceRequest, {"acks": 1}, b"", (InvalidRequestError, "missing field 'topics'")),
    ("produce-topics-a-map", ProduceRequest, {"topics": {"name": "t"}}, b"", (InvalidRequestError, "'topics' has type dict")),
    ("produce-topic-entry-a-string", ProduceRequest, {"topics": ["t"]}, b"", (InvalidRequestError, "entries of 'topics' must be maps")),
    ("produce-partitions-missing", ProduceRequest, {"topics": [{"name": "t"}]}, b"", (InvalidRequestError, "missing field 'partitions'")),
    ("produce-size-missing", ProduceRequest, _produce([{"partition": 0}]), b"", (InvalidRequestError, "missing field 'size'")),
    ("produce-size-negative", ProduceRequest, _produce([{"partition": 0, "size": -1}]), b"", (InvalidRequestError, "'size' must be >= 0")),
    ("produce-size-str", ProduceRequest, _produce([{"partition": 0, "size": "3"}]), b"abc", (InvalidRequestError, "'size' has type str")),
    ("produce-sizes-beyond-payload", ProduceRequest, _produce([{"partition": 0, "size": 4}]), b"abc",
     (InvalidRequestError, "claim more than the payload's 3 bytes")),
    ("produce-payload-unclaimed", ProduceRequest, _produce([{"partition": 0, "size": 2}]), b"abc",
     (InvalidRequestError, "1 bytes not claimed")),
    ("produce-epoch-str", ProduceRequest, _produce([{"partition": 0, "size": 0, "current_leader_epoch": "1"}]), b"",
     (InvalidRequestError, "'current_leader_epoch' has type str")),
    ("fetch-offset-missing", FetchRequest, _fetch({"fetch_offset": None}), b"", (InvalidRequestError, "missing field 'fetch_offset'")),
    ("fetch-offset-float", FetchRequest, _fetch({"fetch_offset": 0.0}), b"", (InvalidRequestError, "'fetch_offset' has type float")),
    ("fetch-partition-max-bytes-str", FetchRequest, _fetch({"max_bytes": "1"}), b"", (InvalidRequestError, "'max_bytes' has type str")),
    ("fetch-max-wait-str", FetchRequest, _fetch({}, max_wait_ms="1"), b"", (InvalidRequestError, "'max_wait_ms' has type str")),
    ("fetch-min-bytes-bool", FetchRequest, _fetch({}, min_bytes=True), b"", (InvalidRequestError, "'min_bytes' must not be a bool")),
    ("fetch-partitions-an-int", FetchRequest, {"topics": [{"name": "t", "partitions": 0}]}, b"",
     (InvalidRequestError, "'partitions' has type int")),
    ("handshake-negative-broker-id", BrokerHandshakeRequest, {"broker_id": -1, "incarnation": "ab"}, b"",
     (InvalidRequestError, "a handshake names a broker id (>= 0)")),
    ("handshake-incarnation-too-long", BrokerHandshakeRequest, {"broker_id": 0, "incarnation": "a" * 129}, b"",
     (InvalidRequestError, "at most 128 characters")),
    ("handshake-incarnation-missing", BrokerHandshakeRequest, {"broker_id": 0}, b"",
     (InvalidRequestError, "missing field 'incarnation'")),
    ("list-offsets-topics-missing", ListOffsetsRequest, {}, b"", (InvalidRequestError, "missing field 'topics'")),
    ("metadata-topics-a-string", MetadataRequest, {"topics": "t"}, b"", (InvalidRequestError, "'topics' has type str")),
    ("metadata-name-an-int", MetadataRequest, {"topics": ["t", 5]}, b"", (InvalidRequestError, "topic names must be strings, got int")),
    ("create-topics-validate-only-int", CreateTopicsRequest, {"topics": [], "validate_only": 1}, b"",
     (InvalidRequestError, "'validate_only' has type int")),
    ("delete-topics-not-a-list", DeleteTopicsRequest, {"topics": "t"}, b"", (InvalidRequestError, "'topics' has type str")),
    ("alter-configs-entry-a-list", AlterConfigsRequest, {"topics": [["t"]]}, b"", (InvalidRequestError, "entries of 'topics' must be maps")),
    ("fetch-response-sizes-beyond-payload", FetchResponse,
     {"topics": [{"name": "t", "partitions": [{"partition": 0, "error_code": 0, "size": 5}]}]}, b"abc",
     (InvalidRequestError, "claim more than the payload's 3 bytes")),
    ("produce-response-base-offset-str", ProduceResponse,
     {"topics": [{"name": "t", "partitions": [{"partition": 0, "error_code": 0, "base_offset": "0"}]}]}, b"",
     (InvalidRequestError, "'base_offset' has type str")),
    ("metadata-response-isr-strings", MetadataResponse,
     {"brokers": [], "controller_id": 0, "topics": [{"name": "t", "error_code": 0, "partitions": [
         {"partition": 0, "leader": 0, "leader_epoch": 0, "replicas": [0], "isr": ["0"]}]}]}, b"",
     (InvalidRequestError, "'isr' must be a list of ints")),
]


@pytest.mark.parametrize("message_type, control, payload, expected", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_control_is_refused_naming_the_field(message_type, control, payload, expected):
    """A control map that breaks the message's shape raises the named error; nothing is decoded."""
    error, words = expected
    with pytest.raises(error) as raised:
        message_type.from_control(control, memoryview(bytearray(payload)))
    assert type(raised.value) is error and words in str(raised.value)


# -- invalid entries: kept on the entry, the rest of the message decodes -------------------------


def _first(message: Any) -> Any:
    return message.topics[0]


def _first_partition(message: Any) -> Any:
    return message.topics[0].partitions[0]


ENTRY_ERRORS = [
    # id, message type, control, payload, entry getter, (error class, words)
    ("produce-topic-name-int", ProduceRequest, {"topics": [{"name": 5, "partitions": [{"partition": 0, "size": 1}]}]}, b"x",
     _first, (InvalidRequestError, "'name' has type int")),
    ("produce-partition-str", ProduceRequest, _produce([{"partition": "0", "size": 1}]), b"x",
     _first_partition, (InvalidRequestError, "'partition' has type str")),
    ("produce-partition-missing", ProduceRequest, _produce([{"size": 1}]), b"x",
     _first_partition, (InvalidRequestError, "missing field 'partition'")),
    ("fetch-topic-name-list", FetchRequest, {"topics": [{"name": ["t"], "partitions": [{"partition": 0, "fetch_offset": 0}]}]}, b"",
     _first, (InvalidRequestError, "'name' has type list")),
    ("fetch-partition-bool", FetchRequest, _fetch({"partition": True}), b"", _first_partition,
     (InvalidRequestError, "'partition' must not be a bool")),
    ("fetch-topic-id-int", FetchRequest, {"topics": [{"name": "t", "topic_id": 7, "partitions": [
        {"partition": 0, "fetch_offset": 0}]}]}, b"", _first, (InvalidRequestError, "'topic_id' has type int")),
    ("list-offsets-timestamp-minus-3", ListOffsetsRequest,
     {"topics": [{"name": "t", "partitions": [{"partition": 0, "timestamp": -3}]}]}, b"", _first_partition,
     (InvalidRequestError, "timestamp -3 is neither")),
    ("list-offsets-timestamp-missing", ListOffsetsRequest,
     {"topics": [{"name": "t", "partitions": [{"partition": 0}]}]}, b"", _first_partition,
     (InvalidRequestError, "missing field 'timestamp'")),
    ("create-topics-name-missing", CreateTopicsRequest, {"topics": [{"num_partitions": 1}]}, b"", _first,
     (InvalidTopicError, "topic name must be a string")),
    ("create-topics-partitions-str", CreateTopicsRequest, {"topics": [{"name": "t", "num_partitions": "3"}]}, b"", _first,
     (InvalidRequestError, "'num_partitions' has type str")),
    ("create-topics-configs-a-list", CreateTopicsRequest, {"topics": [{"name": "t", "configs": ["retention.ms"]}]}, b"", _first,
     (InvalidRequestError, "'configs' has type list")),
    ("create-topics-config-value-a-map", CreateTopicsRequest, {"topics": [{"name": "t", "configs": {"retention.ms": {"v": 1}}}]},
     b"", _first, (InvalidConfigError, "config 'retention.ms' must be a string or a number")),
    ("delete-topics-name-int", DeleteTopicsRequest, {"topics": [7]}, b"", _first,
     (InvalidRequestError, "topic names must be strings, got int")),
    ("describe-configs-name-list", DescribeConfigsRequest, {"topics": [["t"]]}, b"", _first,
     (InvalidRequestError, "topic names must be strings, got list")),
    ("create-partitions-count-str", CreatePartitionsRequest, {"topics": [{"name": "t", "count": "2"}]}, b"", _first,
     (InvalidRequestError, "'count' has type str")),
    ("create-partitions-name-map", CreatePartitionsRequest, {"topics": [{"name": {"n": "t"}, "count": 2}]}, b"", _first,
     (InvalidRequestError, "'name' has type dict")),
    ("alter-configs-delete-item-list", AlterConfigsRequest, {"topics": [{"name": "t", "delete": [["retention.ms"]]}]}, b"",
     _first, (InvalidRequestError, "config names to reset must be strings")),
    ("alter-configs-set-bytes-key", AlterConfigsRequest, {"topics": [{"name": "t", "set": {b"retention.ms": "1"}}]}, b"",
     _first, (InvalidRequestError, "keys of 'set' must be strings")),
]


@pytest.mark.parametrize("message_type, control, payload, entry, expected", [c[1:] for c in ENTRY_ERRORS],
                         ids=[c[0] for c in ENTRY_ERRORS])
def test_invalid_entry_keeps_its_error_and_the_message_decodes(message_type, control, payload, entry, expected):
    """A fault of one entry (topic or partition) is that entry's error: the handler answers it
    alone, and a valid entry beside it decodes without one."""
    error, words = expected
    message = message_type.from_control(control, memoryview(bytearray(payload)))
    found: PymqError | None = entry(message).error
    assert type(found) is error and words in str(found), found


def test_fetch_topic_id_is_optional_on_the_wire():
    """A fetch without a topic id (an old client's) sends no `topic_id` field and decodes to None;
    one with an id carries it (Kafka's Fetch v13)."""
    partitions = (FetchPartition(0, 5),)
    old, new = FetchRequest((TopicRequest("t", partitions),)), FetchRequest((TopicRequest("t", partitions, "ab12"),))
    assert "topic_id" not in old.to_control()["topics"][0]
    assert round_trip(old).topics[0].topic_id is None
    assert round_trip(new).topics[0].topic_id == "ab12"


def test_a_valid_entry_beside_an_invalid_one_has_no_error():
    """Two produce partitions, the first addressed by a string: only it carries an error, and the
    second still gets its own slice of the payload."""
    control = _produce([{"partition": "0", "size": 1}, {"partition": 1, "size": 2}])
    first, second = ProduceRequest.from_control(control, memoryview(bytearray(b"abc"))).topics[0].partitions
    assert isinstance(first.error, InvalidRequestError) and second.error is None
    assert bytes(second.record_set()) == b"bc"


@pytest.mark.parametrize("make, expected", [
    (lambda: ProduceRequest(()), {"acks": 1, "timeout_ms": 30_000}),
    (lambda: FetchRequest(()), {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": None}),
], ids=["produce", "fetch"])
def test_request_defaults_are_on_the_wire(make: Callable[[], Message], expected: dict[str, Any]):
    """Defaults are sent explicitly, so a broker never guesses what the client meant."""
    control = make().to_control()
    assert {k: control[k] for k in expected} == expected
