"""Typed protocol messages (protocol/messages): every request and response survives
to_control -> msgpack -> from_control unchanged, and malformed controls are refused with an
InvalidRequestError naming the field, or kept as the error of the one entry they concern."""
from __future__ import annotations

from typing import Any, Callable

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol
from common.errors import InvalidConfigError, InvalidRequestError, InvalidRequiredAcksError, InvalidTopicError, PymqError
from protocol import (
    REQUEST_TYPES,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    PartitionResponse,
    ReassignedPartition,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerAddress,
    ConfigChange,
    ConfigEntry,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeTieringRequest,
    DescribeTieringResponse,
    ReplaceRemoteSegmentsRequest,
    ReplaceRemoteSegmentsResponse,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    EpochEndOffset,
    Message,
    BrokerHandshakeRequest,
    BrokerHandshakeResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
    MetadataRequest,
    MetadataResponse,
    NewTopic,
    PartitionCount,
    PartitionMetadata,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    TieringPartition,
    TieringTopic,
    TopicConfigs,
    TopicMetadata,
    TopicRef,
    TopicRequest,
    TopicResponse,
    TopicResult,
)
from segment_format.manifest import RemoteSegment
from segment_format.segment_metadata import SegmentMetadata

PROPERTY = settings(max_examples=60)


def wire(message: Message) -> tuple[dict[str, Any], memoryview]:
    """The control map and payload a peer receives: msgpack-encoded and decoded as the framing does."""
    packed = msgpack.packb(message.to_control(), use_bin_type=True)
    control = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    payload = bytearray().join(bytes(p) for p in message.payload())  # type: ignore[arg-type]
    return control, memoryview(payload)


def round_trip(message: Message) -> Message:
    return type(message).from_control(*wire(message))


# -- strategies ---------------------------------------------------------------------------------

names = st.text(max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
offsets = st.integers(-1, 2**62)
epochs = st.integers(-1, 2**31 - 1)
records = st.binary(max_size=64)
error_codes = st.integers(0, 1_000)
messages_text = st.none() | st.text(max_size=20)
config_values = st.text(max_size=8) | int64 | st.floats(allow_nan=False)
configs = st.dictionaries(st.text(max_size=10), config_values, max_size=3)


def tuples(strategy: st.SearchStrategy[Any], max_size: int = 3) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, max_size=max_size).map(tuple)


produce_requests = st.builds(
    ProduceRequest,
    tuples(st.builds(TopicRequest, names, tuples(st.builds(ProducePartition, int32, records.map(lambda r: (r,)), epochs)))),
    st.sampled_from([-1, 0, 1]), st.integers(0, 2**31 - 1))
produce_responses = st.builds(ProduceResponse, tuples(st.builds(TopicResponse, names, tuples(st.builds(
    ProducePartitionResponse, int32, error_codes, messages_text, offsets, int64, offsets)))))
fetch_requests = st.builds(
    FetchRequest,
    tuples(st.builds(TopicRequest, names, tuples(st.builds(FetchPartition, int32, int64, st.none() | int32, epochs)),
                     st.none() | st.text(max_size=32))),
    int32, int32, st.none() | int32, st.integers(-1, 2**31 - 1))
fetch_responses = st.builds(FetchResponse, tuples(st.builds(TopicResponse, names, tuples(st.builds(
    FetchPartitionResponse, int32, error_codes, messages_text, offsets, offsets, records)))))
list_offsets_requests = st.builds(ListOffsetsRequest, tuples(st.builds(TopicRequest, names, tuples(st.builds(
    ListOffsetsPartition, int32, st.integers(-2, 2**62), epochs)))))
list_offsets_responses = st.builds(ListOffsetsResponse, tuples(st.builds(TopicResponse, names, tuples(st.builds(
    ListOffsetsPartitionResponse, int32, error_codes, messages_text, offsets, int64)))))
offset_for_leader_epoch_requests = st.builds(OffsetForLeaderEpochRequest, tuples(st.builds(TopicRequest, names, tuples(
    st.builds(OffsetForLeaderPartition, int32, epochs, epochs)))), st.integers(-1, 2**31 - 1))
offset_for_leader_epoch_responses = st.builds(OffsetForLeaderEpochResponse, tuples(st.builds(TopicResponse, names, tuples(
    st.builds(EpochEndOffset, int32, error_codes, messages_text, epochs, offsets)))))
metadata_requests = st.builds(MetadataRequest, st.none() | tuples(names))
metadata_responses = st.builds(
    MetadataResponse, tuples(st.builds(BrokerAddress, int32, names, st.integers(0, 65535))), int32,
    tuples(st.builds(TopicMetadata, names, error_codes, messages_text, names, tuples(st.builds(
        PartitionMetadata, int32, int32, epochs, tuples(int32), tuples(int32), error_codes, messages_text,
        tuples(int32))))))
api_versions_responses = st.builds(ApiVersionsResponse, tuples(st.builds(ApiVersionRange, int32, names, int32, int32)))
topic_results = tuples(st.builds(TopicResult, names, error_codes, messages_text))
tiering_partitions = st.builds(TieringPartition, int32, error_codes, messages_text, st.booleans(),
                               *[offsets] * 4, int64, offsets, offsets, int64, int32, offsets, offsets, int64, int32,
                               messages_text)
def remote_segment(base: int, records: int) -> RemoteSegment:
    metadata = SegmentMetadata(base_offset=base, next_offset=base + records, min_timestamp=1_000, max_timestamp=2_000,
                               size_bytes=61 * records, record_count=records, leader_epochs=((0, base),), crc32c=7)
    return RemoteSegment.create(metadata, "0123456789abcdef", (24, 11), (28, 22))


describe_tiering_responses = st.builds(DescribeTieringResponse, tuples(st.builds(
    TieringTopic, names, error_codes, messages_text, tuples(tiering_partitions))))

MESSAGES: list[tuple[str, st.SearchStrategy[Message]]] = [
    ("produce-request", produce_requests),
    ("produce-response", produce_responses),
    ("fetch-request", fetch_requests),
    ("fetch-response", fetch_responses),
    ("list-offsets-request", list_offsets_requests),
    ("list-offsets-response", list_offsets_responses),
    ("metadata-request", metadata_requests),
    ("metadata-response", metadata_responses),
    ("api-versions-request", st.just(ApiVersionsRequest())),
    ("api-versions-response", api_versions_responses),
    ("create-topics-request", st.builds(CreateTopicsRequest, tuples(st.builds(NewTopic, names, int32, int32, configs)),
                                        st.booleans())),
    ("create-topics-response", st.builds(CreateTopicsResponse, topic_results)),
    ("delete-topics-request", st.builds(DeleteTopicsRequest, tuples(st.builds(TopicRef, names)))),
    ("delete-topics-response", st.builds(DeleteTopicsResponse, topic_results)),
    ("create-partitions-request", st.builds(CreatePartitionsRequest, tuples(st.builds(PartitionCount, names, int32)),
                                            st.booleans())),
    ("create-partitions-response", st.builds(CreatePartitionsResponse, topic_results)),
    ("describe-configs-request", st.builds(DescribeConfigsRequest, tuples(st.builds(TopicRef, names)))),
    ("describe-configs-response", st.builds(DescribeConfigsResponse, tuples(st.builds(
        TopicConfigs, names, error_codes, messages_text, tuples(st.builds(ConfigEntry, names, config_values, names)))))),
    ("alter-configs-request", st.builds(AlterConfigsRequest, tuples(st.builds(ConfigChange, names, configs, tuples(names))),
                                        st.booleans())),
    ("alter-configs-response", st.builds(AlterConfigsResponse, topic_results)),
    ("offset-for-leader-epoch-request", offset_for_leader_epoch_requests),
    ("offset-for-leader-epoch-response", offset_for_leader_epoch_responses),
    ("alter-partition-reassignments-request", st.builds(AlterPartitionReassignmentsRequest, tuples(st.builds(
        TopicRequest, names, tuples(st.builds(ReassignedPartition, int32, st.none() | tuples(int32, 4))))))),
    ("alter-partition-reassignments-response", st.builds(AlterPartitionReassignmentsResponse, tuples(st.builds(
        TopicResponse, names, tuples(st.builds(PartitionResponse, int32, error_codes, messages_text)))))),
    ("describe-tiering-request", st.builds(DescribeTieringRequest, st.none() | tuples(names))),
    ("describe-tiering-response", describe_tiering_responses),
    ("replace-remote-segments-request", st.builds(
        ReplaceRemoteSegmentsRequest, names, int32, st.sampled_from(["", "ab" * 16]), int32,
        st.lists(st.tuples(st.integers(0, 2**62), st.sampled_from(["0123456789abcdef", "fedcba9876543210"])),
                 min_size=1, max_size=3).map(tuple),
        tuples(st.builds(remote_segment, st.integers(0, 2**40), st.integers(1, 10_000))))),
    ("replace-remote-segments-response", st.builds(ReplaceRemoteSegmentsResponse, error_codes, messages_text, int32)),
    ("broker-handshake-request", st.builds(BrokerHandshakeRequest, st.integers(0, 2**31 - 1),
                                           st.text(alphabet="0123456789abcdef", max_size=32))),
    ("broker-handshake-response", st.just(BrokerHandshakeResponse())),
]


def test_every_api_has_a_request_message_and_round_trip_strategies_cover_all():
    """REQUEST_TYPES and GROUP_REQUEST_TYPES cover every ApiKey, and this module round-trips a
    request and a response for each API but the group ones (test_group_messages.py does those)."""
    group_keys = {cls.api_key for cls in protocol.GROUP_REQUEST_TYPES}
    assert set(REQUEST_TYPES) | group_keys == set(protocol.ApiKey)
    assert len(MESSAGES) == 2 * len(set(protocol.ApiKey) - group_keys)


@pytest.mark.parametrize("strategy", [m[1] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
@PROPERTY
@given(data=st.data())
def test_message_round_trips_through_msgpack(strategy, data):
    """to_control -> msgpack -> from_control gives an equal message, with no entry errors."""
    message = data.draw(strategy)
    assert round_trip(message) == message


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
