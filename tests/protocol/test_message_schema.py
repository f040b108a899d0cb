"""Messages declared once (protocol/schema.py): every declared message and entry type round-trips
through to_control -> msgpack -> from_control, with Hypothesis strategies derived from the same
declaration the codec is generated from. The test walks `MESSAGE_TYPES`, so a new message is
covered without a test of its own; a new field kind without a strategy here fails loudly."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protocol
from common.errors import InvalidRequestError
from protocol.messages.admin import Configs, TopicName, TopicNames, TopicRef
from protocol.messages.base import Message, TopicRequest, TopicResponse
from protocol.messages.group import PartitionNumbers, Protocols
from protocol.messages.tiering import RemoteSegments, ReplacedSegments
from protocol.schema import (
    INT,
    MESSAGE_TYPES,
    REQUIRED,
    Check,
    Entries,
    PayloadSize,
    PayloadTopics,
    Scalar,
    Seq,
    Topics,
    declared,
    message,
    wire,
)
from segment_format.manifest import RemoteSegment
from segment_format.segment_metadata import SegmentMetadata

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

int64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # msgpack refuses lone surrogates
SCALARS: dict[Any, st.SearchStrategy[Any]] = {
    int: int64, str: text, bool: st.booleans(), bytes: st.binary(max_size=16),
    (str, int, float): text | int64 | st.floats(allow_nan=False),
}


def tuples(strategy: st.SearchStrategy[Any], min_size: int = 0) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, min_size=min_size, max_size=3).map(tuple)


def remote_segment(base: int, records: int) -> RemoteSegment:
    metadata = SegmentMetadata(base_offset=base, next_offset=base + records, min_timestamp=1_000, max_timestamp=2_000,
                               size_bytes=61 * records, record_count=records, leader_epochs=((0, base),), crc32c=7)
    return RemoteSegment.create(metadata, "0123456789abcdef", (24, 11), (28, 22))


def topics(topic_type: type, partitions: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    if topic_type is TopicRequest:
        return tuples(st.builds(TopicRequest, text, tuples(partitions), st.none() | text))
    return tuples(st.builds(TopicResponse, text, tuples(partitions)))


# The strategy of each field kind: scalars and lists by their types, nested kinds by the
# strategies of the entry types they hold, and each API's own kinds by what they accept.
KINDS: dict[type, Callable[[Any], st.SearchStrategy[Any]]] = {
    Scalar: lambda kind: SCALARS[kind.kind],
    Seq: lambda kind: tuples(SCALARS[kind.item]),
    Entries: lambda kind: tuples(strategy(kind.entry_type)),
    Protocols: lambda kind: st.lists(strategy(kind.entry_type), min_size=1, max_size=3,
                                     unique_by=lambda p: p.name).map(tuple),
    Topics: lambda kind: topics(kind.topic_type, strategy(kind.partition_type)),
    PayloadTopics: lambda kind: topics(kind.topic_type, strategy(kind.partition_type)),
    PartitionNumbers: lambda kind: tuples(st.builds(TopicRequest, text, tuples(int64))),
    TopicName: lambda kind: text,
    TopicNames: lambda kind: tuples(st.builds(TopicRef, text)),
    Configs: lambda kind: st.dictionaries(text, SCALARS[(str, int, float)], max_size=3),
    ReplacedSegments: lambda kind: tuples(st.tuples(int64, text), min_size=1),
    RemoteSegments: lambda kind: tuples(st.builds(remote_segment, st.integers(0, 2**40), st.integers(1, 10_000))),
}


def field_strategy(f: dataclasses.Field[Any], spec: Any) -> st.SearchStrategy[Any]:
    """Valid values of a declared field: its kind's, passing its check, None where the wire
    takes null for it; a payload field's bytes."""
    if spec.payload:
        records = st.binary(max_size=16)
        return records.map(lambda r: (r,)) if f.default is dataclasses.MISSING else records
    kind_type = next(t for t in type(spec.kind).__mro__ if t in KINDS)
    values = KINDS[kind_type](spec.kind)
    check: Check | None = spec.check
    if check is not None:
        values = st.sampled_from(check.values) if check.values else values.filter(check.accepts)
    if spec.absent is None:
        values = st.none() | values
    return values


_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {}


def strategy(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of a declared message or entry type (without entry errors)."""
    if cls not in _STRATEGIES:
        _STRATEGIES[cls] = st.deferred(lambda: st.builds(cls, **{
            f.name: field_strategy(f, spec) for f, spec in declared(cls)}))
    return _STRATEGIES[cls]


def frame_round_trip(message: Any) -> Any:
    """Encode as a peer would (control through msgpack, payload bytes after it), then decode."""
    packed = msgpack.packb(message.to_control(), use_bin_type=True)
    control = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    if isinstance(message, Message):
        payload = bytearray().join(bytes(p) for p in message.payload())  # type: ignore[arg-type]
        return type(message).from_control(control, memoryview(payload))
    given_payload = {f.name: getattr(message, f.name) for f, spec in declared(type(message)) if spec.payload}
    return type(message).from_control(control, **given_payload)


def test_every_message_type_is_declared_and_every_api_is_covered():
    """Each API's request and response type is a declared message, so the round trip covers it."""
    for request_type in protocol.REQUEST_TYPES.values():
        assert request_type in MESSAGE_TYPES and request_type.response_type in MESSAGE_TYPES
    assert set(protocol.REQUEST_TYPES) == set(protocol.ApiKey)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=[cls.__name__ for cls in MESSAGE_TYPES])
@PROPERTY
@given(data=st.data())
def test_declared_type_round_trips_through_msgpack(cls, data):
    """to_control -> msgpack -> from_control gives back an equal value, with no entry error."""
    value = data.draw(strategy(cls))
    decoded = frame_round_trip(value)
    assert decoded == value
    if "error" in {f.name for f in dataclasses.fields(cls)}:
        assert decoded.error is None


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=[cls.__name__ for cls in MESSAGE_TYPES])
def test_required_fields_are_refused_when_missing(cls):
    """An empty control map decodes only when every field may be absent; otherwise the error
    names a required field (entry faults stay on the entry)."""
    required = [spec.key or f.name for f, spec in declared(cls) if spec.absent is REQUIRED and not spec.payload]
    entry_level = all(spec.entry for f, spec in declared(cls) if spec.absent is REQUIRED and not spec.payload)
    args = (memoryview(b""),) if issubclass(cls, Message) else ()
    if not required:
        cls.from_control({}, *args)
    elif entry_level:
        assert cls.from_control({}, *args).error is not None
    else:
        with pytest.raises(InvalidRequestError, match="missing field"):
            cls.from_control({}, *args)


def test_a_declaration_that_leaves_a_field_out_is_refused_when_the_class_is_created():
    """A wire_order that misses a field, a field not declared with wire(), or a payload-only kind
    read from the control map fails at import rather than dropping the field from the wire."""
    with pytest.raises(TypeError, match="wire_order"):
        @message
        class Misordered:
            wire_order = ("a",)
            a: int = wire(INT)
            b: int = wire(INT)

    with pytest.raises(TypeError, match="not declared"):
        @message
        class Undeclared:
            a: int = wire(INT)
            b: int = 0

    with pytest.raises(TypeError, match="payload=True"):
        @message
        class SizeFromTheControlMap:
            a: int = wire(PayloadSize(len))
