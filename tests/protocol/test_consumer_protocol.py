"""The consumer group protocol's payloads (protocol/consumer_protocol.py): known bytes pin
the format, subscriptions and assignments survive encode -> decode, later versions are read by
their v0 fields, and malformed peer bytes are refused with an InvalidRequestError naming the
fault, never another exception."""
from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import InvalidRequestError
from protocol.consumer_protocol import PROTOCOL_TYPE, Assignment, Subscription

topics = st.text(min_size=1, max_size=12)
topic_partitions = st.lists(st.tuples(topics, st.integers(0, 2**31 - 1)), max_size=30)
user_data = st.none() | st.binary(max_size=40)
subscriptions = st.builds(Subscription, st.lists(topics, max_size=10).map(tuple), topic_partitions.map(tuple),
                          st.integers(-1, 2**31 - 1), user_data)
assignments = st.builds(Assignment, topic_partitions.map(tuple), user_data)


def packed(control: Any) -> bytes:
    return msgpack.packb(control, use_bin_type=True)


def subscription_control(**changes: Any) -> dict[str, Any]:
    control = {"version": 0, "topics": ["a"], "owned_partitions": {"a": [0]}, "generation_id": 1}
    control.update(changes)
    return control


def test_protocol_type_is_consumer() -> None:
    """The coordinator decodes assignments only for this protocol type, Kafka's name for it."""
    assert PROTOCOL_TYPE == "consumer"


def test_subscription_known_bytes() -> None:
    """A subscription encodes to these exact bytes: the format is pinned."""
    subscription = Subscription(("b", "a"), (("a", 1), ("b", 2), ("a", 0)), 3, b"x")
    assert subscription.encode().hex() == (
        "85a776657273696f6e00a6746f7069637392a161a162b06f776e65645f706172746974696f6e7382a161920001"
        "a1629102ad67656e65726174696f6e5f696403a9757365725f64617461c40178")


def test_assignment_known_bytes() -> None:
    """An assignment encodes to these exact bytes, user_data omitted when None."""
    assert Assignment((("t", 2), ("t", 0))).encode().hex() == "82a776657273696f6e00aa706172746974696f6e7381a174920002"


def test_constructors_sort_and_deduplicate() -> None:
    """Topics and partitions are canonical whatever order the caller gives, so equal contents are equal."""
    assert Subscription(("b", "a", "b"), (("t", 1), ("t", 0), ("t", 1))) == Subscription(("a", "b"), (("t", 0), ("t", 1)))
    assert Assignment((("b", 0), ("a", 3), ("a", 1))).partitions == (("a", 1), ("a", 3), ("b", 0))


def test_partitions_by_topic_groups_sorted() -> None:
    """The per-topic view lists topics and their partitions in order."""
    assert Assignment((("b", 0), ("a", 3), ("a", 1))).partitions_by_topic() == {"a": [1, 3], "b": [0]}


def test_subscription_defaults_round_trip() -> None:
    """A new member's subscription (no owned partitions, no generation, no user data) round trips."""
    subscription = Subscription(("t",))
    assert subscription.generation_id == -1
    assert Subscription.decode(subscription.encode()) == subscription


@given(subscriptions)
def test_subscription_round_trip(subscription: Subscription) -> None:
    """Every subscription survives encode -> decode."""
    assert Subscription.decode(subscription.encode()) == subscription


@given(assignments)
def test_assignment_round_trip(assignment: Assignment) -> None:
    """Every assignment survives encode -> decode, also from a bytearray or memoryview."""
    data = assignment.encode()
    assert Assignment.decode(data) == assignment
    assert Assignment.decode(memoryview(bytearray(data))) == assignment


def test_later_version_with_v0_fields_is_read() -> None:
    """A later version that only adds fields is read by its v0 fields; the unknown ones are ignored."""
    data = packed(subscription_control(version=7, rack="r1"))
    assert Subscription.decode(data) == Subscription(("a",), (("a", 0),), 1)
    assert Assignment.decode(packed({"version": 3, "partitions": {"t": [1]}, "extra": [1, 2]})) == Assignment((("t", 1),))


def test_later_version_without_v0_fields_is_refused() -> None:
    """A later version that dropped a v0 field cannot be read."""
    control = subscription_control(version=1)
    del control["owned_partitions"]
    with pytest.raises(InvalidRequestError, match="missing field 'owned_partitions'"):
        Subscription.decode(packed(control))


SUBSCRIPTION_FAULTS = [
    ("text", "x", "must be bytes, got str"),
    ("none", None, "must be bytes, got NoneType"),
    ("empty", b"", "not valid msgpack"),
    ("truncated", packed(subscription_control())[:-3], "not valid msgpack"),
    ("trailing bytes", packed(subscription_control()) + b"\x00", "not valid msgpack"),
    ("list", packed([1, 2]), "must be a msgpack map, got list"),
    ("no version", packed({k: v for k, v in subscription_control().items() if k != "version"}),
     "missing field 'version'"),
    ("negative version", packed(subscription_control(version=-1)), "'version' must be >= 0"),
    ("bool version", packed(subscription_control(version=True)), "'version' must not be a bool"),
    ("topics not a list", packed(subscription_control(topics={"a": 1})), "'topics' has type dict"),
    ("topic not a string", packed(subscription_control(topics=["a", 3])), "entries of 'topics' must be strings"),
    ("duplicate topic", packed(subscription_control(topics=["a", "a"])), "duplicate topic"),
    ("owned not a map", packed(subscription_control(owned_partitions=[["a", 0]])), "'owned_partitions' has type list"),
    ("bytes topic key", packed(subscription_control(owned_partitions={b"a": [0]})),
     "keys of 'owned_partitions' must be strings"),
    ("partitions not a list", packed(subscription_control(owned_partitions={"a": 0})),
     "owned_partitions['a'] must be a list of partitions, got int"),
    ("bool partition", packed(subscription_control(owned_partitions={"a": [False]})),
     "partition numbers in owned_partitions['a'] must be ints, got bool"),
    ("float partition", packed(subscription_control(owned_partitions={"a": [1.0]})), "must be ints, got float"),
    ("negative partition", packed(subscription_control(owned_partitions={"a": [-1]})), "must be >= 0, got -1"),
    ("duplicate partition", packed(subscription_control(owned_partitions={"a": [1, 1]})),
     "duplicate partition in owned_partitions['a']"),
    ("no generation", packed({k: v for k, v in subscription_control().items() if k != "generation_id"}),
     "missing field 'generation_id'"),
    ("generation below -1", packed(subscription_control(generation_id=-2)), "'generation_id' must be >= -1"),
    ("user data text", packed(subscription_control(user_data="x")), "'user_data' has type str"),
]


@pytest.mark.parametrize("data, message", [case[1:] for case in SUBSCRIPTION_FAULTS],
                         ids=[case[0] for case in SUBSCRIPTION_FAULTS])
def test_malformed_subscription_is_refused(data: Any, message: str) -> None:
    """Each malformed subscription is refused with an error naming its fault."""
    with pytest.raises(InvalidRequestError, match="consumer protocol subscription: .*" + re.escape(message)):
        Subscription.decode(data)


ASSIGNMENT_FAULTS = [
    ("no partitions", packed({"version": 0}), "missing field 'partitions'"),
    ("partitions a list", packed({"version": 0, "partitions": [["t", 0]]}), "'partitions' has type list"),
    ("bool partition", packed({"version": 0, "partitions": {"t": [True]}}), "must be ints, got bool"),
    ("negative partition", packed({"version": 0, "partitions": {"t": [-5]}}), "must be >= 0, got -5"),
    ("duplicate partition", packed({"version": 0, "partitions": {"t": [2, 0, 2]}}), "duplicate partition"),
    ("a subscription", Subscription(("t",)).encode(), "missing field 'partitions'"),
]


@pytest.mark.parametrize("data, message", [case[1:] for case in ASSIGNMENT_FAULTS],
                         ids=[case[0] for case in ASSIGNMENT_FAULTS])
def test_malformed_assignment_is_refused(data: bytes, message: str) -> None:
    """Each malformed assignment is refused with an error naming its fault."""
    with pytest.raises(InvalidRequestError, match="consumer protocol assignment: .*" + re.escape(message)):
        Assignment.decode(data)


@given(st.binary(max_size=200))
def test_random_bytes_decode_or_are_refused(data: bytes) -> None:
    """Any bytes either decode or raise InvalidRequestError, for both payloads."""
    for payload_type in (Subscription, Assignment):
        try:
            payload_type.decode(data)
        except InvalidRequestError:
            pass


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5) | st.binary(max_size=3), children, max_size=4),
    max_leaves=20)
field_values = st.fixed_dictionaries({}, optional={
    "version": st.integers(-2, 3) | msgpack_values, "topics": st.lists(st.text(max_size=3), max_size=3) | msgpack_values,
    "owned_partitions": st.dictionaries(st.text(max_size=3), st.lists(st.integers(-2, 5), max_size=3)) | msgpack_values,
    "partitions": st.dictionaries(st.text(max_size=3), st.lists(st.integers(-2, 5), max_size=3)) | msgpack_values,
    "generation_id": st.integers(-3, 5) | msgpack_values, "user_data": msgpack_values})


@given(field_values | msgpack_values)
def test_random_structures_decode_or_are_refused(control: Any) -> None:
    """Near-valid and arbitrary msgpack structures either decode or raise InvalidRequestError."""
    data = packed(control)
    for payload_type in (Subscription, Assignment):
        try:
            payload_type.decode(data)
        except InvalidRequestError:
            pass
