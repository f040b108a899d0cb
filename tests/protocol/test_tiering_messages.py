"""DescribeTiering messages (protocol/messages/tiering.py): explicit round trips through
msgpack, the wire form of defaults, malformed requests refused naming the field, and per-topic
errors that come back as their error classes. (test_messages.py round-trips random ones too.)"""
from __future__ import annotations

from typing import Any

import msgpack
import pytest

from common.errors import InvalidRequestError, KafkaStorageError, UnknownTopicOrPartitionError
from protocol import (
    REQUEST_TYPES,
    ApiKey,
    DescribeTieringRequest,
    DescribeTieringResponse,
    Message,
    TieringPartition,
    TieringTopic,
)
from protocol.framing import SUPPORTED_VERSIONS


def round_trip(message: Message) -> Message:
    control = msgpack.unpackb(msgpack.packb(message.to_control(), use_bin_type=True), raw=False)
    return type(message).from_control(control, memoryview(b""))


TIERED = TieringPartition(
    3, tiered=True, log_start_offset=0, local_log_start_offset=9500, log_end_offset=10_000, high_watermark=10_000,
    local_bytes=61_133, remote_log_start_offset=0, remote_log_end_offset=9500, remote_bytes=1_161_527,
    remote_segments=19, manifest_version=19, upload_lag_offsets=500, upload_lag_bytes=61_133, failures=2,
    last_error="RemoteStorageError: down")


def test_api_key_is_pymqs_own_and_registered() -> None:
    """1000 lies outside Kafka's numbering; version 0 only; the request names its response."""
    assert ApiKey.DESCRIBE_TIERING == 1000
    assert REQUEST_TYPES[ApiKey.DESCRIBE_TIERING] is DescribeTieringRequest
    assert SUPPORTED_VERSIONS[ApiKey.DESCRIBE_TIERING] == (0, 0)
    assert DescribeTieringRequest.response_type is DescribeTieringResponse


@pytest.mark.parametrize("message", [
    DescribeTieringRequest(),
    DescribeTieringRequest(("a", "b")),
    DescribeTieringRequest(()),
    DescribeTieringResponse(()),
    DescribeTieringResponse((TieringTopic("t", partitions=(TIERED, TieringPartition(4))),
                             TieringTopic("gone", 3, "unknown topic 'gone'"))),
], ids=["all", "named", "none-named", "empty", "full"])
def test_round_trip(message: Message) -> None:
    assert round_trip(message) == message


def test_request_wire_form() -> None:
    """None (all topics) and an empty list (no topic) are different requests."""
    assert DescribeTieringRequest().to_control() == {"topics": None}
    assert DescribeTieringRequest(("a",)).to_control() == {"topics": ["a"]}
    assert DescribeTieringRequest.from_control({}, memoryview(b"")).topics is None


def test_partition_defaults_are_not_tiered() -> None:
    """An entry with only its partition decodes as not tiered: offsets -1, counts 0."""
    decoded = TieringPartition.from_control({"partition": 1})
    assert decoded == TieringPartition(1)
    assert (decoded.tiered, decoded.remote_log_end_offset, decoded.remote_bytes, decoded.manifest_version) == (
        False, -1, 0, -1)
    assert not decoded.remote_known and TIERED.remote_known


@pytest.mark.parametrize("control, field", [
    ({"topics": "t"}, "topics"),
    ({"topics": ["t", 3]}, "topics"),
])
def test_malformed_request_names_the_field(control: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        DescribeTieringRequest.from_control(control, memoryview(b""))


def test_malformed_response_field_is_refused() -> None:
    bad = TIERED.to_control() | {"remote_bytes": "many"}
    with pytest.raises(InvalidRequestError, match="remote_bytes"):
        TieringPartition.from_control(bad)


def test_errors_come_back_as_their_classes() -> None:
    response = round_trip(DescribeTieringResponse((
        TieringTopic("gone", UnknownTopicOrPartitionError.code, "unknown topic 'gone'"),
        TieringTopic("t", partitions=(TieringPartition(0, KafkaStorageError.code, "closed"),)))))
    gone, t = response.topics  # type: ignore[attr-defined]
    assert isinstance(gone.error(), UnknownTopicOrPartitionError) and gone.partitions == ()
    assert t.error() is None and isinstance(t.partitions[0].error(), KafkaStorageError)
