"""The request limits applied at decode (protocol/messages/limits.py): element counts for
every API, and the group fields' bounds."""
from __future__ import annotations

from typing import Any

import pytest

from common.errors import InvalidRequestError, TooManyElementsError
from protocol import REQUEST_TYPES
from protocol.messages.limits import (
    GROUP_INSTANCE_ID_MAX_CHARS,
    GROUP_STRING_MAX_BYTES,
    MEMBER_ID_MAX_BYTES,
    RequestLimits,
    check_group_instance_id,
    check_group_string,
    count_elements,
)


@pytest.mark.parametrize("control, count", [
    ({}, 0),
    ({"acks": 1, "timeout_ms": 5}, 0),
    ({"topics": ["a", "b", "c"]}, 3),
    ({"topics": None}, 0),
    ({"topics": [{"name": "t", "partitions": [{"partition": 0, "timestamp": -1}]}]}, 1 + 2 + 1 + 2),
    ({"configs": {"a": "1", "b": "2"}}, 2),
    ({"nested": [[1, 2], [3, [4, 5]]]}, 2 + 2 + 2 + 2),
], ids=["empty", "scalars-only", "names", "null-list", "topic-partition-entry", "map", "nested-lists"])
def test_elements_are_list_items_and_map_entries_below_the_control_map(control: dict[str, Any], count: int) -> None:
    """What counts toward request.max.elements, in a few shapes."""
    assert count_elements(control, 1_000) == count


def test_counting_stops_past_the_limit() -> None:
    """Refusing a huge request costs O(limit): the count stops once it passes, here at the
    topics list's length, without walking its 100,000 entries (which would add their names)."""
    control = {"topics": [{"name": str(i)} for i in range(100_000)]}
    assert count_elements(control, 10) == 100_000


@pytest.mark.parametrize("request_type", REQUEST_TYPES.values(), ids=lambda t: t.__name__)
def test_every_request_type_refuses_too_many_elements_before_decoding(request_type: type) -> None:
    """Any API's request with one element too many is TooManyElementsError (INVALID_REQUEST),
    whatever its shape: counted before its own decoding looks at any field."""
    limits = RequestLimits(max_elements=100)
    with pytest.raises(TooManyElementsError, match="request.max.elements") as refused:
        request_type.decode({"topics": [{"name": "t"}] * 51}, memoryview(b""), limits)  # 51 items + 51 names
    assert refused.value.code == InvalidRequestError.code


@pytest.mark.parametrize("value, ok", [
    (None, True),
    ("consumer-1.a_b", True),
    ("x" * GROUP_INSTANCE_ID_MAX_CHARS, True),
    ("x" * (GROUP_INSTANCE_ID_MAX_CHARS + 1), False),
    ("", False),
    (".", False),
    ("..", False),
    ("a/b", False),
    ("é", False),
], ids=["absent", "legal", "longest", "too-long", "empty", "dot", "dot-dot", "slash", "non-ascii"])
def test_group_instance_ids_follow_kafkas_rule(value: str | None, ok: bool) -> None:
    if ok:
        check_group_instance_id(value)
    else:
        with pytest.raises(InvalidRequestError, match="group_instance_id"):
            check_group_instance_id(value)


@pytest.mark.parametrize("value, max_bytes, ok", [
    ("c" * GROUP_STRING_MAX_BYTES, GROUP_STRING_MAX_BYTES, True),
    ("c" * (GROUP_STRING_MAX_BYTES + 1), GROUP_STRING_MAX_BYTES, False),
    ("é" * (GROUP_STRING_MAX_BYTES // 2 + 1), GROUP_STRING_MAX_BYTES, False),  # 2 UTF-8 bytes each
    ("m" * MEMBER_ID_MAX_BYTES, MEMBER_ID_MAX_BYTES, True),
], ids=["longest", "one-byte-too-long", "multibyte-too-long", "longest-member-id"])
def test_group_strings_are_bounded_in_utf8_bytes(value: str, max_bytes: int, ok: bool) -> None:
    if ok:
        check_group_string("client_id", value, max_bytes)
    else:
        with pytest.raises(InvalidRequestError, match=f"'client_id' is longer than {max_bytes} UTF-8 bytes"):
            check_group_string("client_id", value, max_bytes)


def test_member_metadata_is_bounded_by_its_config() -> None:
    limits = RequestLimits(member_metadata_max_bytes=1024)
    limits.check_member_bytes("an assignment", 1024)
    with pytest.raises(InvalidRequestError, match="group.member.metadata.max.bytes"):
        limits.check_member_bytes("an assignment", 1025)
