"""Wire protocol: framing, API keys and control-field access (DESIGN.md section 4).

Every frame is length-prefixed, big enough to be pipelined and matched by correlation id:

    request  = size:int32 | api_key:int16 | api_version:int16 | correlation_id:int32
               | control_length:int32 | control: msgpack map | payload: raw bytes
    response = size:int32 | correlation_id:int32 | control_length:int32 | control | payload

`size` counts the bytes after itself. Control fields (topic names, offsets, error codes) are a
msgpack map; the payload carries record batches exactly as stored, so the broker appends produce
payloads and serves fetch payloads (with sendfile) without re-encoding. All integers are
big-endian, like Kafka's framing (record batch headers are little-endian; they belong to the
batch format, not the frame).

This module is pure: no sockets, no asyncio. `FrameDecoder` turns a byte stream into frames and
checks each size against the limit *before* buffering the frame, so an oversize request costs
no memory: it is skipped byte by byte and answered with an error.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import msgpack

from broker.errors import InvalidRequestError

REQUEST_HEADER = struct.Struct(">ihhii")  # size, api_key, api_version, correlation_id, control_length
RESPONSE_HEADER = struct.Struct(">iii")  # size, correlation_id, control_length
_SIZE = struct.Struct(">i")
REQUEST_HEADER_AFTER_SIZE = REQUEST_HEADER.size - 4


class ApiKey(enum.IntEnum):
    """API keys, numbered as Kafka numbers them so that Kafka readers feel at home."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37


# The versions of each API this broker speaks: (min, max).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}

# ListOffsets special timestamps, as in Kafka.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request frame. `payload` is a view into the frame's buffer."""

    api_key: int
    api_version: int
    correlation_id: int
    control: dict[str, Any]
    payload: memoryview


@dataclass(frozen=True, slots=True)
class OversizeRequest:
    """A frame whose size exceeded the limit: it was skipped, not buffered; answer with an error."""

    api_key: int
    correlation_id: int
    size: int


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """A complete frame whose header or control map could not be decoded."""

    correlation_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Response:
    correlation_id: int
    control: dict[str, Any]
    payload: memoryview


Frame = Request | OversizeRequest | MalformedRequest


class FrameDecoder:
    """Incremental decoder for request frames with a hard size limit.

    Feed it bytes as they arrive; it yields complete frames. Frames larger than `max_frame_bytes`
    are announced as `OversizeRequest` as soon as their header is read, and their remaining bytes
    are discarded as they arrive, so the connection stays usable and nothing large is allocated.
    A negative size cannot be resynchronized and raises InvalidRequestError: close the connection.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversize frame still to discard

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[Frame]:
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = memoryview(data)[dropped:]
        self._buf += data
        buf = self._buf
        pos = 0
        try:
            while len(buf) - pos >= REQUEST_HEADER.size:
                size, api_key, api_version, correlation_id, control_length = REQUEST_HEADER.unpack_from(buf, pos)
                if size < REQUEST_HEADER_AFTER_SIZE:
                    raise InvalidRequestError(f"frame size {size} is smaller than the request header")
                if size + 4 > self.max_frame_bytes:
                    available = len(buf) - pos - 4
                    self._skip = size - min(size, available)
                    pos += 4 + min(size, available)
                    yield OversizeRequest(api_key, correlation_id, size + 4)
                    continue
                end = pos + 4 + size
                if len(buf) < end:
                    break
                frame = _decode_request(buf, pos, end, api_key, api_version, correlation_id, control_length)
                pos = end  # consumed before yielding: a caller that stops iterating never sees it twice
                yield frame
        finally:
            if pos:
                del buf[:pos]


def _decode_request(buf: bytearray, pos: int, end: int, api_key: int, api_version: int,
                    correlation_id: int, control_length: int) -> Frame:
    start = pos + REQUEST_HEADER.size
    if control_length < 0 or start + control_length > end:
        return MalformedRequest(correlation_id, f"control_length {control_length} outside the frame")
    # One copy per frame, into a bytearray: the payload outlives the decoder's buffer, and the log
    # patches base offsets into it in place before appending.
    frame = buf[start:end]
    try:
        control = msgpack.unpackb(frame[:control_length], raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several unrelated types for bad input
        return MalformedRequest(correlation_id, f"control fields are not valid msgpack: {err}")
    if not isinstance(control, dict):
        return MalformedRequest(correlation_id, "control fields must be a msgpack map")
    return Request(api_key, api_version, correlation_id, control, memoryview(frame)[control_length:])


def encode_request(api_key: int, api_version: int, correlation_id: int, control: dict[str, Any],
                   payload_size: int = 0) -> bytes:
    """The frame header and control map of a request; the caller writes `payload_size` bytes after."""
    packed = msgpack.packb(control, use_bin_type=True)
    size = REQUEST_HEADER_AFTER_SIZE + len(packed) + payload_size
    return REQUEST_HEADER.pack(size, api_key, api_version, correlation_id, len(packed)) + packed


def encode_response(correlation_id: int, control: dict[str, Any], payload_size: int = 0) -> bytes:
    """The frame header and control map of a response; the caller writes `payload_size` bytes after."""
    packed = msgpack.packb(control, use_bin_type=True)
    size = RESPONSE_HEADER.size - 4 + len(packed) + payload_size
    return RESPONSE_HEADER.pack(size, correlation_id, len(packed)) + packed


class ResponseDecoder:
    """Incremental decoder for response frames (client side); `max_frame_bytes` guards memory."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[Response]:
        self._buf += data
        buf = self._buf
        pos = 0
        try:
            while len(buf) - pos >= RESPONSE_HEADER.size:
                size, correlation_id, control_length = RESPONSE_HEADER.unpack_from(buf, pos)
                if size < RESPONSE_HEADER.size - 4 or size + 4 > self.max_frame_bytes:
                    raise InvalidRequestError(f"response frame size {size} outside 8..{self.max_frame_bytes}")
                end = pos + 4 + size
                if len(buf) < end:
                    break
                start = pos + RESPONSE_HEADER.size
                frame = bytes(buf[start:end])
                pos = end
                if control_length < 0 or control_length > len(frame):
                    raise InvalidRequestError(f"response control_length {control_length} outside the frame")
                try:
                    control = msgpack.unpackb(frame[:control_length], raw=False)
                except Exception as err:  # msgpack raises several unrelated types for bad input
                    raise InvalidRequestError(f"response control fields are not valid msgpack: {err}") from err
                if not isinstance(control, dict):
                    raise InvalidRequestError("response control fields must be a msgpack map")
                yield Response(correlation_id, control, memoryview(frame)[control_length:])
        finally:
            if pos:
                del buf[:pos]


# -- typed access to control fields: a wrong type is the client's fault, so INVALID_REQUEST ------

_MISSING = object()


def field(control: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    """`control[name]` checked to be of `kind`; absent -> `default`, or InvalidRequestError if none."""
    value = control.get(name, _MISSING)
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


def entries(control: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """`control[name]` as a list of maps (e.g. topics, partitions)."""
    items = field(control, name, list)
    for item in items:
        if not isinstance(item, dict):
            raise InvalidRequestError(f"entries of {name!r} must be maps")
    return items
