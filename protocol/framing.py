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
from typing import Any, Iterator, Protocol

import msgpack
import numpy as np

from common.errors import InvalidRequestError, TooManyElementsError

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
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ALTER_PARTITION_REASSIGNMENTS = 45
    OFFSET_DELETE = 47
    DESCRIBE_TRANSACTIONS = 65
    # pymq's own APIs, numbered from 1000: outside Kafka's numbering, so they never collide with a Kafka key.
    DESCRIBE_TIERING = 1000
    REPLACE_REMOTE_SEGMENTS = 1001
    BROKER_HANDSHAKE = 1010  # inter-broker identity (protocol/messages/replication.py)


# The versions of each API this broker speaks: (min, max).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}

@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request frame. `payload` is a view into the frame's buffer. `elements`: the
    control map's list items and map entries (its own entries included), counted while it was
    decoded within the decoder's bound; -1 when the decoder counted none."""

    api_key: int
    api_version: int
    correlation_id: int
    control: dict[str, Any]
    payload: memoryview
    elements: int = -1


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


class FrameBudget(Protocol):
    """Where the bytes of large frames being received are reserved before they are read (the
    broker's `queued.max.request.bytes`, broker/backpressure.py ByteBudget)."""

    def try_reserve(self, nbytes: int) -> bool: ...

    def unreserve(self, nbytes: int) -> None: ...


class ScratchPool:
    """Receive buffers lent to frame readers while they hold unparsed bytes.

    A reader takes one for a receive and gives it back as soon as it holds no more than a small
    part of a frame (which it keeps as a copy of its own), so an idle connection holds none and a
    broker with a thousand connections needs about one. At most `max_free` buffers are kept for
    reuse; they are never freed, so the allocator is not left with holes the size of a buffer."""

    def __init__(self, buffer_bytes: int, max_free: int) -> None:
        self.buffer_bytes = buffer_bytes
        self.max_free = max_free
        self._free: list[memoryview] = []

    @property
    def free_buffers(self) -> int:
        """Buffers kept for reuse now."""
        return len(self._free)

    def take(self) -> memoryview:
        """A buffer from `numpy.empty`: not zeroed, so its pages cost memory only once bytes are
        received into them (a receive that finds the connection closed costs nothing)."""
        return self._free.pop() if self._free else memoryview(np.empty(self.buffer_bytes, dtype=np.uint8)).cast("B")

    def give(self, buffer: memoryview) -> None:
        if len(self._free) < self.max_free:
            self._free.append(buffer)


class _FrameReader(abc.ABC):
    """Receives length-prefixed frames with the fewest copies (the asyncio.BufferedProtocol shape).

    The transport asks `get_buffer()` where to put the next bytes and reports them with
    `received(nbytes)`, which returns the frames they completed. Small frames arrive many per
    `recv` into a scratch buffer and are copied out once each (their payload must outlive the
    scratch). A frame of `direct_bytes` or more gets its own buffer as soon as its header is read,
    and the kernel writes the rest of it straight there: no copy at all for the large produce and
    fetch frames that carry the data. The buffer comes from `numpy.empty`, so a header announcing a
    big frame costs address space, not resident memory, until the bytes actually arrive.

    Memory a reader holds between frames: the scratch buffer is borrowed from a `ScratchPool` and
    given back once no more than `carry_bytes` of a frame are left in it (those are copied aside),
    so an idle reader holds nothing. With a `budget`, a large frame's whole announced size is
    reserved from it before its body is read (`try_reserve`); while the budget has no room the
    reader stops at the header (`waiting_bytes`) and the caller stops reading the socket, then
    calls `received(0)` to try again. The reservation is released as the frame is delivered, or
    by `close()`.

    `feed(data)` does the same for bytes already in hand (tests, the fuzz mirror).
    """

    HEADER: struct.Struct  # the fixed frame header, starting with the int32 size

    def __init__(self, max_frame_bytes: int, *, scratch_bytes: int = 256 << 10, direct_bytes: int = 64 << 10,
                 carry_bytes: int = 4 << 10, pool: ScratchPool | None = None,
                 budget: FrameBudget | None = None) -> None:
        self._pool = pool or ScratchPool(max(scratch_bytes, self.HEADER.size), max_free=1)
        if direct_bytes > self._pool.buffer_bytes // 2:
            raise ValueError("direct_bytes must be at most half of the scratch buffer, so a smaller frame always fits")
        self.max_frame_bytes = max_frame_bytes
        self.direct_bytes = direct_bytes
        self.carry_bytes = carry_bytes
        self._budget = budget
        self._scratch: memoryview | None = None  # borrowed from the pool while bytes are in it
        self._carry = b""  # the start of a frame kept aside while the scratch is back in the pool
        self._start = self._end = 0  # unread bytes are _scratch[_start:_end]
        self._direct: memoryview | None = None  # the body of a large frame being received in place
        self._direct_header: tuple[int, ...] = ()
        self._filled = 0
        self._skip = 0  # bytes of an oversize frame still to discard
        self.waiting_bytes = 0  # a large frame's size the budget had no room for (0: not waiting)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of incomplete frames held (0 between frames)."""
        return (self._end - self._start + len(self._carry)
                + (self.HEADER.size + self._filled if self._direct is not None else 0))

    @property
    def reserved_bytes(self) -> int:
        """The budget reserved for the large frame being received (0 if none)."""
        return len(self._direct) if self._direct is not None and self._budget is not None else 0

    def close(self) -> None:
        """Drop what is held: the scratch goes back to the pool, a reservation to the budget."""
        if self._direct is not None and self._budget is not None:
            self._budget.unreserve(len(self._direct))
        self._direct, self._carry, self.waiting_bytes = None, b"", 0
        self._start = self._end  # what is left is dropped
        self._give_back()

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._direct is not None:
            return self._direct[self._filled:]
        scratch = self._borrow()
        if self._start == self._end:
            self._start = self._end = 0
        elif len(scratch) - self._end < self.direct_bytes:
            # What is left is the start of one frame smaller than direct_bytes: move it to the
            # front so that the rest of it fits.
            tail = self._end - self._start
            scratch[:tail] = scratch[self._start:self._end]
            self._start, self._end = 0, tail
        return scratch[self._end:]

    def received(self, nbytes: int) -> Iterator[Any]:
        """Account for `nbytes` written into the last `get_buffer()`; yield the completed frames.

        A generator, so that the frames before a framing error are still delivered before it
        raises. Each frame is consumed before it is yielded: a caller that stops iterating never
        sees a frame twice, and the frames it did not take come with the next call (`received(0)`)."""
        if self._direct is not None:
            self._filled += nbytes
            if self._filled < len(self._direct):
                return
            body, header = self._direct, self._direct_header
            self._direct, self._filled = None, 0
            if self._budget is not None:
                self._budget.unreserve(len(body))  # the caller holds the request from here on
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

    def _borrow(self) -> memoryview:
        """The scratch, taken from the pool (with the carried bytes put back in front) if needed."""
        if self._scratch is None:
            self._scratch = self._pool.take()
            carry = len(self._carry)
            self._scratch[:carry] = self._carry
            self._start, self._end, self._carry = 0, carry, b""
        return self._scratch

    def _give_back(self) -> None:
        """Return the scratch to the pool if what is left in it is small (kept aside) or nothing."""
        if self._scratch is None:
            return
        left = self._end - self._start
        if left > self.carry_bytes:
            return
        self._carry = bytes(self._scratch[self._start:self._end]) if left else b""
        self._pool.give(self._scratch)
        self._scratch, self._start, self._end = None, 0, 0

    def _parse(self) -> Iterator[Any]:
        scratch, header_size = self._borrow(), self.HEADER.size
        while True:
            if self._skip:
                dropped = min(self._skip, self._end - self._start)
                self._skip -= dropped
                self._start += dropped
            available = self._end - self._start
            if available < header_size:
                break
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
                yield self._frame(header, memoryview(bytearray(scratch[body_start:body_start + body_size])))
                continue
            if body_size >= self.direct_bytes:
                if self._budget is not None and not self._budget.try_reserve(body_size):
                    self.waiting_bytes = body_size
                    break
                self.waiting_bytes = 0
                body = memoryview(np.empty(body_size, dtype=np.uint8)).cast("B")
                have = self._end - body_start
                body[:have] = scratch[body_start:self._end]
                self._direct, self._direct_header, self._filled = body, header, have
                self._start = self._end = 0
            break
        self._give_back()

    def _check_size(self, header: tuple[int, ...]) -> None:
        """Raise InvalidRequestError for a size that cannot be resynchronized."""
        if header[0] < self.HEADER.size - 4:
            raise InvalidRequestError(f"frame size {header[0]} is smaller than the frame header")

    def _oversize(self, header: tuple[int, ...]) -> Any:
        raise InvalidRequestError(f"frame of {header[0] + 4} bytes exceeds the limit {self.max_frame_bytes}")

    @abc.abstractmethod
    def _frame(self, header: tuple[int, ...], body: memoryview) -> Any:
        """Decode one complete frame from its header fields and the bytes after the header."""


class _ElementCounter:
    """msgpack hooks that count the items of every list and the entries of every map as each one is
    decoded, and stop the decoding past `limit`.

    A control map of 100 MiB of one-byte strings decodes into ~50 M Python objects (GBs): the
    frame budget counts wire bytes, not what they decode into. With each container bounded by
    `max_array_len`/`max_map_len` = `limit` and the running total checked as each container
    completes, at most about twice `limit` elements are ever built for one request. The exact,
    per-message count (`messages.limits.RequestLimits`) runs after decoding."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def list_hook(self, items: list[Any]) -> list[Any]:
        self._add(len(items))
        return items

    def object_hook(self, entries: dict[Any, Any]) -> dict[Any, Any]:
        self._add(len(entries))
        return entries

    def _add(self, n: int) -> None:
        self.count += n
        if self.count > self.limit:
            raise TooManyElementsError(f"the request holds more than {self.limit} elements (list items and map "
                                       f"entries; request.max.elements)")


class FrameDecoder(_FrameReader):
    """Request frames (broker side). A frame over the limit is announced as `OversizeRequest` as
    soon as its header is read and its bytes are discarded as they arrive, so the connection stays
    usable and nothing large is allocated. A size too small to hold the header cannot be
    resynchronized and raises InvalidRequestError: close the connection. A control map with more
    than `max_elements` list items and map entries (None: no bound) is a `MalformedRequest`
    naming `request.max.elements`, refused while it decodes (`_ElementCounter`)."""

    HEADER = REQUEST_HEADER

    def __init__(self, max_frame_bytes: int, *, max_elements: int | None = None, **kwargs: Any) -> None:
        super().__init__(max_frame_bytes, **kwargs)
        self.max_elements = max_elements

    def _control(self, packed: memoryview) -> tuple[Any, int]:
        """The decoded control and its element count (-1 without a bound)."""
        if self.max_elements is None:
            return msgpack.unpackb(packed, raw=False, strict_map_key=True), -1
        counter = _ElementCounter(self.max_elements)
        control = msgpack.unpackb(packed, raw=False, strict_map_key=True, max_array_len=self.max_elements,
                                  max_map_len=self.max_elements, list_hook=counter.list_hook,
                                  object_hook=counter.object_hook)
        return control, counter.count

    def _oversize(self, header: tuple[int, ...]) -> OversizeRequest:
        size, api_key, _, correlation_id, _ = header
        return OversizeRequest(api_key, correlation_id, size + 4)

    def _frame(self, header: tuple[int, ...], body: memoryview) -> Frame:
        _, api_key, api_version, correlation_id, control_length = header
        if control_length < 0 or control_length > len(body):
            return MalformedRequest(correlation_id, f"control_length {control_length} outside the frame")
        try:
            control, elements = self._control(body[:control_length])
        except TooManyElementsError as err:
            return MalformedRequest(correlation_id, str(err))
        except ValueError as err:
            if "exceeds max_" in str(err):  # one list or map over the bound (msgpack's max_*_len)
                return MalformedRequest(correlation_id, f"the request holds more than {self.max_elements} elements "
                                                        f"in one list or map (request.max.elements)")
            return MalformedRequest(correlation_id, f"control fields are not valid msgpack: {err}")
        except Exception as err:  # msgpack raises several unrelated types for bad input
            return MalformedRequest(correlation_id, f"control fields are not valid msgpack: {err}")
        if not isinstance(control, dict):
            return MalformedRequest(correlation_id, "control fields must be a msgpack map")
        return Request(api_key, api_version, correlation_id, control, body[control_length:], elements)


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
