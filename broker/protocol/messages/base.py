"""What every typed message shares: its API key and version, the payload parts it carries, and the
error fields of its outcomes.

A message is a frozen slotted dataclass. `to_control()` gives the msgpack control map sent on the
wire, `payload()` the raw bytes written after it (record batches, never re-encoded), and the
classmethod `from_control(control, payload)` decodes and validates a received one in one place.
Requests name their response type, so a caller sends a request and gets the matching response.

Errors travel as today: `error_code` (0 for none) and `error_message` on each outcome; the
top-level `error_code` of a response is 0 unless the whole request failed, in which case the
server answers with only the error fields (see `broker.handlers.error_fields`) and the client
raises that error before decoding anything else.
"""
from __future__ import annotations

from dataclasses import field as dataclass_field
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, Union

from broker.errors import NONE, PymqError, error_for_code
from broker.protocol.fields import entries, field
from broker.protocol.framing import ApiKey

Buffer = Union[bytes, bytearray, memoryview]
NO_LEADER_EPOCH = -1  # "not checked": the partition entry names no leader epoch (KIP-320)


class PayloadRange(Protocol):
    """Payload bytes that stay where they are until the response is written (a segment file range
    sent with sendfile, `broker.log.FetchSlice`); the protocol needs only their size."""

    @property
    def size(self) -> int: ...


Part = Union[Buffer, PayloadRange]


def part_size(part: Part) -> int:
    """Bytes a payload part puts on the wire."""
    if isinstance(part, (bytes, bytearray, memoryview)):
        return len(part)
    return part.size


def entry_error() -> Any:
    """The `error` field of a request entry: why that entry alone cannot be served, found while
    decoding it (None when it can). Not part of equality: it is decode-side information, never
    encoded, and exceptions compare by identity."""
    return dataclass_field(default=None, compare=False)


class Message(ABC):
    """Base of every request and response message."""

    __slots__ = ()
    api_key: ClassVar[ApiKey]
    api_version: ClassVar[int] = 0

    @abstractmethod
    def to_control(self) -> dict[str, Any]:
        """The control map sent on the wire."""

    @classmethod
    @abstractmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> Self:
        """Decode and validate a received message; InvalidRequestError names the faulty field."""

    def payload(self) -> list[Part]:
        """The raw bytes written after the control map, in order (none for most messages)."""
        return []


R = TypeVar("R", bound=Message)
T = TypeVar("T")


class RequestMessage(Message, Generic[R]):
    """A request; `response_type` decodes its answer."""

    __slots__ = ()
    response_type: ClassVar[type[Any]]


class Outcome:
    """Mixin for entries that carry `error_code` / `error_message` (a partition's or topic's result)."""

    __slots__ = ()
    error_code: int
    error_message: str | None

    def error(self) -> PymqError | None:
        """The error this outcome names, or None for success."""
        return None if self.error_code == NONE else error_for_code(self.error_code, self.error_message)


def code_and_message(err: PymqError | None) -> tuple[int, str | None]:
    """(error_code, error_message) of an outcome."""
    return (NONE, None) if err is None else (err.code, str(err))


def put_error(out: dict[str, Any], code: int, message: str | None) -> dict[str, Any]:
    """Add the error fields to an outcome's control map; the message only when there is one."""
    out["error_code"] = code
    if message is not None:
        out["error_message"] = message
    return out


def decode_error(control: dict[str, Any]) -> tuple[int, str | None]:
    """The error fields of an outcome's control map."""
    return field(control, "error_code", int, NONE), field(control, "error_message", str, None)


def topics_control(topics: Iterable[Any]) -> dict[str, Any]:
    """The control map of a response answered per topic and partition (produce, fetch, list
    offsets): each partition outcome encodes itself."""
    return {"error_code": NONE, "topics": [{"name": t.name, "partitions": [p.to_control() for p in t.partitions]}
                                           for t in topics]}


def decode_topics(control: dict[str, Any], topic_type: Callable[[str, tuple[Any, ...]], T],
                  decode_partition: Callable[[dict[str, Any]], Any]) -> tuple[T, ...]:
    """The topics of a response answered per topic and partition, each partition decoded by
    `decode_partition` (its outcome type's `from_control`)."""
    return tuple(topic_type(field(t, "name", str), tuple(decode_partition(p) for p in entries(t, "partitions")))
                 for t in entries(control, "topics"))
