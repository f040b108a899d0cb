"""What every typed message shares: its API key and version, the payload parts it carries, and the
error fields of its outcomes.

A message is a frozen slotted dataclass declared with `protocol.schema` (`@message`, each field
a `wire(...)`). `to_control()` gives the msgpack control map sent on the wire, `payload()` the raw
bytes written after it (record batches, never re-encoded), and the classmethod
`from_control(control, payload)` decodes and validates a received one in one place; both codec
methods are generated from the declaration.
Requests name their response type, so a caller sends a request and gets the matching response.

Errors travel as today: `error_code` (0 for none) and `error_message` on each outcome; the
top-level `error_code` of a response is 0 unless the whole request failed, in which case the
server answers with only the error fields (see `broker.handlers.error_fields`) and the client
raises that error before decoding anything else.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar, Union

from common.errors import NONE, PymqError, error_for_code
from protocol.fields import entries, entry_field, field
from protocol.framing import ApiKey
from protocol.messages.limits import RequestLimits
from protocol.schema import INT, error_code_field, error_message_field, message, wire

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

    @classmethod
    def decode(cls, control: dict[str, Any], payload: memoryview, limits: RequestLimits, elements: int = -1) -> Self:
        """Decode a received request within the broker's `limits`: its elements are counted before
        any per-element work (TooManyElementsError; `elements` >= 0 is the count the frame decoder
        already made within the same bound, so they are not walked again), then `from_control`
        decodes it and `check_bounds` checks its fields' sizes (InvalidRequestError), before any
        handler runs."""
        if elements < 0:
            limits.check_elements(control)
        message = cls.from_control(control, payload)
        message.check_bounds(limits)
        return message

    def check_bounds(self, limits: RequestLimits) -> None:
        """InvalidRequestError for a field larger than `limits` allow (the group messages'
        ids and member metadata); nothing to check for most requests."""


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


@message
class PartitionResponse(Outcome):
    """One partition's answer in a response answered per topic and partition: its number, its
    error fields, and the fields its API adds (declared by a subclass; none for a bare outcome
    such as OffsetCommit's and OffsetDelete's).

    On the wire: {partition, <own fields>, error_code, error_message?}, or, for a subclass that is
    not `errors_last`, {partition, error_code, error_message?, <own fields>}; the order is part
    of the known bytes.
    """

    errors_last: ClassVar[bool] = True
    partition: int = wire(INT)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()


P = TypeVar("P", bound=PartitionResponse)
E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class TopicResponse(Generic[P]):
    """A topic's partition answers, in the order of the request's entries."""

    name: str
    partitions: tuple[P, ...]

    def to_control(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": [p.to_control() for p in self.partitions]}

    @classmethod
    def from_control(cls, control: dict[str, Any], parse: Callable[[dict[str, Any]], P]) -> "TopicResponse[P]":
        """Decode one topic entry, each partition with `parse` (its type's `from_control`)."""
        return cls(field(control, "name", str), tuple(parse(p) for p in entries(control, "partitions")))


@dataclass(frozen=True, slots=True)
class TopicRequest(Generic[E]):
    """A topic's partition entries in a request addressed per topic and partition. `error` is
    set when the topic entry is malformed (its name or id is not a string): the handler answers
    every partition of it with that error and the other topics go on.

    `topic_id` (optional, KIP-516; Fetch reads it): the incarnation of the topic the sender means.
    A broker whose log of that name is another incarnation (deleted and re-created) answers
    INCONSISTENT_TOPIC_ID. On the wire only when set, so senders that never set it send the bytes
    they always did."""

    name: str
    partitions: tuple[E, ...]
    topic_id: str | None = None
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        if self.topic_id is None:
            return {"name": self.name, "partitions": [p.to_control() for p in self.partitions]}  # type: ignore[attr-defined]
        return {"name": self.name, "topic_id": self.topic_id,
                "partitions": [p.to_control() for p in self.partitions]}  # type: ignore[attr-defined]

    @classmethod
    def from_control(cls, control: dict[str, Any], parse: Callable[[dict[str, Any]], E]) -> "TopicRequest[E]":
        """Decode one topic entry, each partition with `parse`; a bad name or id stays on the entry."""
        name, name_error = entry_field(control, "name", str, "")
        topic_id, id_error = entry_field(control, "topic_id", str, None, None)
        return cls(name, tuple(parse(p) for p in entries(control, "partitions")), topic_id, name_error or id_error)


class TopicResponses(Message):
    """Responses answered per topic and partition with nothing else (Produce, Fetch, ListOffsets):
    `topics` (declared by each as `Topics(TopicResponse, <its partition type>)`), and the
    whole-request error_code 0."""

    __slots__ = ()
    topics: tuple[TopicResponse[Any], ...]
