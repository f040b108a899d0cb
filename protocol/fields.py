"""Typed access to control fields, used by every message's `from_control`.

A control map comes from a peer, so every value is checked before use: a wrong type, a bool where
an int belongs, a missing field are the sender's fault and raise InvalidRequestError naming the
field. Fields whose fault concerns one entry of a request only (a topic name that is not a string,
a partition that is not an int) are read with `entry_field`, which returns the error instead of
raising it: the message keeps it on that entry and the handler answers that entry alone with it,
as Kafka answers per partition.
"""
from __future__ import annotations

from typing import Any

from common.errors import InvalidRequestError

_MISSING: Any = object()
REQUIRED: Any = _MISSING  # as a `default`: none, the field must be present


def field(control: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    """`control[name]` checked to be of `kind`; absent -> `default`, or InvalidRequestError if none."""
    value = control.get(name, _MISSING)
    if value.__class__ is kind:  # the common case, one comparison (bool is not int here either)
        return value
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise InvalidRequestError(f"missing field {name!r}")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequestError(f"field {name!r} must not be a bool")
    if not isinstance(value, kind):
        raise InvalidRequestError(f"field {name!r} has type {type(value).__name__}")
    return value


def non_negative(control: dict[str, Any], name: str, default: Any = _MISSING) -> int:
    """An int field that must be >= 0 (sizes, timeouts)."""
    value = field(control, name, int, default)
    if value is not None and value < 0:
        raise InvalidRequestError(f"field {name!r} must be >= 0, got {value}")
    return value


def entries(control: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """`control[name]` as a list of maps (e.g. topics, partitions)."""
    items = field(control, name, list)
    for item in items:
        if not isinstance(item, dict):
            raise InvalidRequestError(f"entries of {name!r} must be maps")
    return items


def entry_field(control: dict[str, Any], name: str, kind: type, placeholder: Any,
                default: Any = _MISSING) -> tuple[Any, InvalidRequestError | None]:
    """(value, None), or (placeholder, the error) when the field is missing or mistyped: for
    fields whose fault belongs to one entry of the request, not to the whole of it."""
    value = control.get(name)
    if value.__class__ is kind:
        return value, None
    try:
        return field(control, name, kind, default), None
    except InvalidRequestError as err:
        return placeholder, err


def string_keys(mapping: dict[Any, Any], name: str) -> InvalidRequestError | None:
    """The error for a map whose keys are not all strings (msgpack also allows bytes keys)."""
    for key in mapping:
        if not isinstance(key, str):
            return InvalidRequestError(f"keys of {name!r} must be strings, got {type(key).__name__}")
    return None
