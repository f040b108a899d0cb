"""Wire framing and API keys (docs/architecture.md, Wire protocol).

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

import abc
import enum
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import msgpack
import numpy as np

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
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ALTER_PARTITION_REASSIGNMENTS = 45
    OFFSET_DELETE = 47
    # pymq's own APIs, numbered from 1000: outside Kafka's numbering, so they never collide with a Kafka key.
    DESCRIBE_TIERING = 1000
    REPLACE_REMOTE_SEGMENTS = 1001
    BROKER_HANDSHAKE = 1010  # inter-broker identity (protocol/messages/replication.py)


# The versions of each API this broker speaks: (min, max).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}

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


class _FrameReader(abc.ABC):
    """Receives length-prefixed frames with the fewest copies (the asyncio.BufferedProtocol shape).

    The transport asks `get_buffer()` where to put the next bytes and reports them with
    `received(nbytes)`, which returns the frames they completed. Small frames arrive many per
    `recv` into a scratch buffer and are copied out once each (their payload must outlive the
    scratch). A frame of `direct_bytes` or more gets its own buffer as soon as its header is read,
    and the kernel writes the rest of it straight there: no copy at all for the large produce and
    fetch frames that carry the data. The buffer comes from `numpy.empty`, so a header announcing a
    big frame costs address space, not resident memory, until the bytes actually arrive.

    `feed(data)` does the same for bytes already in hand (tests, the fuzz mirror).
    """

    HEADER: struct.Struct  # the fixed frame header, starting with the int32 size

    def __init__(self, max_frame_bytes: int, *, scratch_bytes: int = 256 << 10, direct_bytes: int = 64 << 10) -> None:
        if direct_bytes > scratch_bytes // 2:
            raise ValueError("direct_bytes must be at most half of scratch_bytes, so a smaller frame always fits")
        self.max_frame_bytes = max_frame_bytes
        self.direct_bytes = direct_bytes
        self._scratch = bytearray(max(scratch_bytes, self.HEADER.size))
        self._start = self._end = 0  # unread bytes are _scratch[_start:_end]
        self._direct: memoryview | None = None  # the body of a large frame being received in place
        self._direct_header: tuple[int, ...] = ()
        self._filled = 0
        self._skip = 0  # bytes of an oversize frame still to discard

    @property
    def buffered_bytes(self) -> int:
        """Bytes of incomplete frames held (0 between frames)."""
        return self._end - self._start + (self.HEADER.size + self._filled if self._direct is not None else 0)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._direct is not None:
            return self._direct[self._filled:]
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._scratch) - self._end < self.direct_bytes:
            # What is left is the start of one frame smaller than direct_bytes: move it to the
            # front so that the rest of it fits.
            tail = self._end - self._start
            self._scratch[:tail] = self._scratch[self._start:self._end]
            self._start, self._end = 0, tail
        return memoryview(self._scratch)[self._end:]

    def received(self, nbytes: int) -> Iterator[Any]:
        """Account for `nbytes` written into the last `get_buffer()`; yield the completed frames.

        A generator, so that the frames before a framing error are still delivered before it
        raises. Each frame is consumed before it is yielded: a caller that stops iterating never
        sees a frame twice, and the frames it did not take come with the next call."""
        if self._direct is not None:
            self._filled += nbytes
            if self._filled < len(self._direct):
                return
            body, header = self._direct, self._direct_header
            self._direct, self._filled = None, 0
            yield self._frame(header, body)
            return
        self._end += nbytes
        yield from self._parse()

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[Any]:
        """Decode bytes already in hand, copying them through `get_buffer` as a transport would.
        Iterate it to the end: bytes not yet copied when the caller stops are dropped."""
        data = memoryview(data).cast("B")
        pos = 0
        while pos < len(data):
            buf = self.get_buffer()
            n = min(len(buf), len(data) - pos)
            buf[:n] = data[pos:pos + n]
            pos += n
            yield from self.received(n)
        if not data:
            yield from self.received(0)

    def _parse(self) -> Iterator[Any]:
        scratch, header_size = self._scratch, self.HEADER.size
        while True:
            if self._skip:
                dropped = min(self._skip, self._end - self._start)
                self._skip -= dropped
                self._start += dropped
            available = self._end - self._start
            if available < header_size:
                return
            header = self.HEADER.unpack_from(scratch, self._start)
            size = header[0]
            self._check_size(header)
            if size + 4 > self.max_frame_bytes:
                self._start += header_size
                self._skip = size + 4 - header_size
                yield self._oversize(header)
                continue
            body_start, body_size = self._start + header_size, size + 4 - header_size
            if available >= size + 4:
                self._start = body_start + body_size  # consumed before decoding: never delivered twice
                # One copy, into a buffer of its own: the payload outlives the scratch, and the
                # log patches base offsets into it in place before appending.
                yield self._frame(header, memoryview(scratch[body_start:body_start + body_size]))
                continue
            if body_size >= self.direct_bytes:
                body = memoryview(np.empty(body_size, dtype=np.uint8)).cast("B")
                have = self._end - body_start
                body[:have] = scratch[body_start:self._end]
                self._direct, self._direct_header, self._filled = body, header, have
                self._start = self._end = 0
            return

    def _check_size(self, header: tuple[int, ...]) -> None:
        """Raise InvalidRequestError for a size that cannot be resynchronized."""
        if header[0] < self.HEADER.size - 4:
            raise InvalidRequestError(f"frame size {header[0]} is smaller than the frame header")

    def _oversize(self, header: tuple[int, ...]) -> Any:
        raise InvalidRequestError(f"frame of {header[0] + 4} bytes exceeds the limit {self.max_frame_bytes}")

    @abc.abstractmethod
    def _frame(self, header: tuple[int, ...], body: memoryview) -> Any:
        """Decode one complete frame from its header fields and the bytes after the header."""


class FrameDecoder(_FrameReader):
    """Request frames (broker side). A frame over the limit is announced as `OversizeRequest` as
    soon as its header is read and its bytes are discarded as they arrive, so the connection stays
    usable and nothing large is allocated. A size too small to hold the header cannot be
    resynchronized and raises InvalidRequestError: close the connection."""

    HEADER = REQUEST_HEADER

    def _oversize(self, header: tuple[int, ...]) -> OversizeRequest:
        size, api_key, _, correlation_id, _ = header
        return OversizeRequest(api_key, correlation_id, size + 4)

    def _frame(self, header: tuple[int, ...], body: memoryview) -> Frame:
        _, api_key, api_version, correlation_id, control_length = header
        if control_length < 0 or control_length > len(body):
            return MalformedRequest(correlation_id, f"control_length {control_length} outside the frame")
        try:
            control = msgpack.unpackb(body[:control_length], raw=False, strict_map_key=True)
        except Exception as err:  # msgpack raises several unrelated types for bad input
            return MalformedRequest(correlation_id, f"control fields are not valid msgpack: {err}")
        if not isinstance(control, dict):
            return MalformedRequest(correlation_id, "control fields must be a msgpack map")
        return Request(api_key, api_version, correlation_id, control, body[control_length:])


class ResponseDecoder(_FrameReader):
    """Response frames (client side). Any framing fault raises InvalidRequestError: a broker that
    sends one is not to be trusted with the rest of the stream."""

    HEADER = RESPONSE_HEADER

    def _oversize(self, header: tuple[int, ...]) -> Any:
        start = (header[0] & 0xFFFFFFFF).to_bytes(4, "big")
        raise InvalidRequestError(f"a frame of {header[0] + 4} bytes exceeds the limit {self.max_frame_bytes}; "
                                  f"its first bytes are {start!r}")

    def _frame(self, header: tuple[int, ...], body: memoryview) -> Response:
        _, correlation_id, control_length = header
        if control_length < 0 or control_length > len(body):
            raise InvalidRequestError(f"response control_length {control_length} outside the frame")
        try:
            control = msgpack.unpackb(body[:control_length], raw=False)
        except Exception as err:  # msgpack raises several unrelated types for bad input
            raise InvalidRequestError(f"response control fields are not valid msgpack: {err}") from err
        if not isinstance(control, dict):
            raise InvalidRequestError("response control fields must be a msgpack map")
        return Response(correlation_id, control, body[control_length:])


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
