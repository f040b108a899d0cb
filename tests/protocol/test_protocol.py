"""Wire framing (protocol/framing.py, fields.py): incremental request/response decoding, the frame size limit,
malformed frames, and typed access to control fields."""
from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.backpressure import ByteBudget
from common.errors import InvalidRequestError
from protocol import (
    REQUEST_HEADER,
    ApiKey,
    FrameDecoder,
    MalformedRequest,
    OversizeRequest,
    Request,
    ResponseDecoder,
    ScratchPool,
    encode_request,
    encode_response,
    entries,
    field,
)

PROPERTY = settings(max_examples=150)


def _request(correlation_id: int, control: dict | None = None, payload: bytes = b"", api_key: int = ApiKey.PRODUCE,
             api_version: int = 0) -> bytes:
    control = {"topic": "t", "n": correlation_id} if control is None else control
    return encode_request(api_key, api_version, correlation_id, control, len(payload)) + payload


def _raw_frame(correlation_id: int, control_bytes: bytes, control_length: int | None = None, payload: bytes = b"") -> bytes:
    """A request frame with hand-made control bytes, for frames encode_request cannot produce."""
    length = len(control_bytes) if control_length is None else control_length
    size = REQUEST_HEADER.size - 4 + len(control_bytes) + len(payload)
    return REQUEST_HEADER.pack(size, ApiKey.FETCH, 0, correlation_id, length) + control_bytes + payload


def _summary(frame) -> tuple:
    """A comparable summary of a decoded frame (payload memoryviews become bytes)."""
    if isinstance(frame, Request):
        return ("request", frame.api_key, frame.api_version, frame.correlation_id, frame.control, bytes(frame.payload))
    if isinstance(frame, OversizeRequest):
        return ("oversize", frame.api_key, frame.correlation_id, frame.size)
    return ("malformed", frame.correlation_id)


def _feed_all(decoder: FrameDecoder, chunks) -> list:
    return [_summary(f) for chunk in chunks for f in decoder.feed(chunk)]


# -- FrameDecoder ---------------------------------------------------------------------------------


def test_request_round_trips_through_encode_request_and_decoder():
    """encode_request + payload decodes to the same api key, version, correlation id, control and payload."""
    frame = _request(7, {"topic": "orders", "partition": 3, "blob": b"\x00\x01"}, b"PAYLOAD", ApiKey.FETCH, 0)
    [decoded] = FrameDecoder(1 << 20).feed(frame)
    assert isinstance(decoded, Request)
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (ApiKey.FETCH, 0, 7)
    assert decoded.control == {"topic": "orders", "partition": 3, "blob": b"\x00\x01"}
    assert bytes(decoded.payload) == b"PAYLOAD"


def test_frame_split_at_every_byte_boundary_reassembles_identically():
    """Feeding a frame in two chunks split at any byte yields exactly the frame fed whole."""
    frame = _request(11, payload=b"0123456789")
    whole = _feed_all(FrameDecoder(1 << 20), [frame])
    for cut in range(len(frame) + 1):
        decoder = FrameDecoder(1 << 20)
        assert _feed_all(decoder, [frame[:cut], frame[cut:]]) == whole
        assert decoder.buffered_bytes == 0


def test_frame_fed_one_byte_at_a_time_decodes_once_complete():
    """Nothing is yielded until the last byte arrives; then exactly one frame."""
    frame = _request(12, payload=b"abc")
    decoder = FrameDecoder(1 << 20)
    for i in range(len(frame) - 1):
        assert list(decoder.feed(frame[i : i + 1])) == []
    assert [f.correlation_id for f in decoder.feed(frame[-1:])] == [12]


def test_pipelined_frames_in_one_chunk_decode_in_order():
    """Several frames in one chunk, the last one partial, yield the complete ones in order."""
    frames = [_request(i, payload=bytes([i]) * i) for i in range(1, 6)]
    partial = _request(99, payload=b"tail")
    decoder = FrameDecoder(1 << 20)
    assert [f.correlation_id for f in decoder.feed(b"".join(frames) + partial[:-2])] == [1, 2, 3, 4, 5]
    assert decoder.buffered_bytes == len(partial) - 2
    assert [f.correlation_id for f in decoder.feed(partial[-2:])] == [99]


def test_frame_exactly_at_the_limit_is_accepted_and_one_byte_over_is_oversize():
    """A frame of max_frame_bytes total is decoded; one byte more is announced as oversize."""
    frame = _request(1, payload=b"p" * 50)
    [at_limit] = FrameDecoder(len(frame)).feed(frame)
    [over] = FrameDecoder(len(frame) - 1).feed(frame)
    assert isinstance(at_limit, Request)
    assert over == OversizeRequest(ApiKey.PRODUCE, 1, len(frame))


@pytest.mark.parametrize("chunk", [1, 7, 18, 64, 10_000], ids=lambda c: f"chunk_{c}")
def test_oversize_frame_is_announced_and_skipped_then_next_frame_decodes(chunk):
    """An oversize frame yields OversizeRequest with its correlation id; its bytes, however they
    arrive, are discarded without buffering, and the frame after it decodes normally."""
    big = _request(5, payload=b"B" * 5_000, api_key=ApiKey.PRODUCE)
    small = _request(6, payload=b"ok")
    stream = big + small
    decoder = FrameDecoder(1_000)
    out = []
    for i in range(0, len(stream), chunk):
        out.extend(_summary(f) for f in decoder.feed(stream[i : i + chunk]))
        assert decoder.buffered_bytes <= 1_000
    assert out == [
        ("oversize", ApiKey.PRODUCE, 5, len(big)),
        ("request", ApiKey.PRODUCE, 0, 6, {"topic": "t", "n": 6}, b"ok"),
    ]


def test_oversize_frame_is_announced_before_its_body_arrives():
    """The header alone is enough to reject an oversize frame: the announcement does not wait."""
    big = _request(8, payload=b"B" * 5_000)
    decoder = FrameDecoder(1_000)
    assert [_summary(f) for f in decoder.feed(big[: REQUEST_HEADER.size])] == [("oversize", ApiKey.PRODUCE, 8, len(big))]
    assert list(decoder.feed(big[REQUEST_HEADER.size :])) == []
    assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("size", [-1, -(2**31), 0, REQUEST_HEADER.size - 5], ids=["minus_one", "int32_min", "zero", "one_short"])
def test_size_smaller_than_request_header_raises_invalid_request(size):
    """A negative or too-small size cannot be resynchronized: the decoder raises INVALID_REQUEST."""
    frame = REQUEST_HEADER.pack(size, 0, 0, 1, 0)
    with pytest.raises(InvalidRequestError):
        list(FrameDecoder(1 << 20).feed(frame))


def test_minimal_size_is_not_a_framing_error():
    """A size covering exactly the header is framed fine (its empty control map is malformed)."""
    frame = REQUEST_HEADER.pack(REQUEST_HEADER.size - 4, 0, 0, 3, 0)
    assert [_summary(f) for f in FrameDecoder(1 << 20).feed(frame)] == [("malformed", 3)]


@pytest.mark.parametrize(
    "control_bytes",
    [b"\xc1", b"\x81\xa1", msgpack.packb([1, 2]), msgpack.packb("text"), msgpack.packb({1: 2}), msgpack.packb({}) + b"\x01"],
    ids=["reserved_byte", "truncated_map", "array", "string", "int_key", "trailing_bytes"],
)
def test_control_that_is_not_a_msgpack_map_is_malformed_and_stream_continues(control_bytes):
    """Bad control bytes yield MalformedRequest with the correlation id; the next frame still decodes."""
    decoder = FrameDecoder(1 << 20)
    frames = list(decoder.feed(_raw_frame(21, control_bytes, payload=b"pp") + _request(22)))
    assert isinstance(frames[0], MalformedRequest) and frames[0].correlation_id == 21
    assert isinstance(frames[1], Request) and frames[1].correlation_id == 22


@pytest.mark.parametrize(
    "control",
    [{"topics": ["t"] * 101}, {"a": list(range(60)), "b": list(range(60))}, {"p": [{"x": 1}] * 60},
     {"topics": [[["x"] * 10] * 5] * 3}],
    ids=["one_long_list", "two_lists_past_the_total", "many_small_maps", "nested_lists"],
)
def test_control_with_more_elements_than_the_bound_is_refused_while_it_decodes(control):
    """A control map past max_elements (one container or the total) is MalformedRequest naming
    request.max.elements, and the next frame still decodes: a frame of tiny elements cannot make
    the broker build more objects than the bound before it refuses."""
    decoder = FrameDecoder(1 << 20, max_elements=100)
    frames = list(decoder.feed(_request(41, control) + _request(42)))
    assert isinstance(frames[0], MalformedRequest) and frames[0].correlation_id == 41
    assert "request.max.elements" in frames[0].reason
    assert isinstance(frames[1], Request) and frames[1].correlation_id == 42


def test_control_within_the_element_bound_decodes_whole():
    """Exactly max_elements list items and map entries (the top-level map's own included) decode."""
    control = {"topics": ["t"] * 50, "p": [{"partition": i} for i in range(24)]}  # 50 + 24 + 24, and the 2 top-level entries
    decoder = FrameDecoder(1 << 20, max_elements=100)
    (frame,) = decoder.feed(_request(43, control))
    assert isinstance(frame, Request) and frame.control == control


@pytest.mark.parametrize("control_length", [-1, 100, 2**31 - 1], ids=["negative", "past_end", "int32_max"])
def test_control_length_outside_the_frame_is_malformed(control_length):
    """A control_length that is negative or runs past the frame yields MalformedRequest."""
    decoder = FrameDecoder(1 << 20)
    frames = list(decoder.feed(_raw_frame(31, msgpack.packb({}), control_length=control_length) + _request(32)))
    assert isinstance(frames[0], MalformedRequest) and frames[0].correlation_id == 31
    assert "control_length" in frames[0].reason
    assert frames[1].correlation_id == 32


def test_payload_is_a_writable_view_that_outlives_the_decoder_buffer():
    """The payload can be patched in place and is unaffected by later feeds."""
    decoder = FrameDecoder(1 << 20)
    [request] = decoder.feed(_request(41, payload=b"abcdef") + _request(42)[:5])
    assert isinstance(request.payload, memoryview) and not request.payload.readonly
    request.payload[0:2] = b"XY"
    list(decoder.feed(_request(42)[5:] + _request(43, payload=b"zzzzzz")))
    assert bytes(request.payload) == b"XYcdef"


def test_large_frame_is_received_in_place_without_a_copy():
    """Once a large frame's header is read, get_buffer() hands out the frame's own buffer: the
    bytes the transport writes there are the payload the frame is delivered with."""
    payload = bytes(range(256)) * 1024
    frame = _request(51, payload=payload)
    decoder = FrameDecoder(1 << 20, scratch_bytes=8192, direct_bytes=4096)
    assert list(decoder.feed(frame[:100])) == []
    target = decoder.get_buffer()
    assert len(target) == len(frame) - 100
    target[:] = frame[100:]
    [request] = decoder.received(len(target))
    assert request.correlation_id == 51 and bytes(request.payload) == payload
    target[-1:] = b"!"  # same memory: the write shows through the delivered payload
    assert bytes(request.payload[-1:]) == b"!"
    assert decoder.buffered_bytes == 0 and [f.correlation_id for f in decoder.feed(_request(52))] == [52]


def test_frame_is_not_redelivered_when_the_caller_stops_iterating():
    """A caller that takes one frame and abandons the generator never sees that frame again."""
    decoder = FrameDecoder(1 << 20)
    frames = decoder.feed(_request(1) + _request(2))
    assert next(frames).correlation_id == 1
    frames.close()
    assert [f.correlation_id for f in decoder.feed(b"")] == [2]


def test_direct_bytes_must_leave_room_for_smaller_frames_in_the_scratch():
    with pytest.raises(ValueError):
        FrameDecoder(1 << 20, scratch_bytes=1000, direct_bytes=600)


def test_a_large_frame_reserves_its_announced_size_before_its_body_is_read():
    """Partly received frames count: the whole body size is taken from the budget as soon as the
    header is read, and handed back as the frame is delivered (the caller holds it from there)."""
    budget = ByteBudget("queued.max.request.bytes", 100_000)
    frame = _request(61, payload=bytes(6000))
    decoder = FrameDecoder(1 << 20, scratch_bytes=8192, direct_bytes=4096, budget=budget)
    assert list(decoder.feed(frame[:100])) == []
    assert budget.used_bytes == len(frame) - REQUEST_HEADER.size
    [request] = decoder.feed(frame[100:])
    assert request.correlation_id == 61 and budget.used_bytes == 0


def test_a_large_frame_waits_at_its_header_until_the_budget_has_room():
    """With no room, the decoder stops at the header (waiting_bytes) and takes nothing; once the
    budget has room, received(0) reserves it and the body is read."""
    budget = ByteBudget("queued.max.request.bytes", 10_000)
    budget.acquire(5000)
    frame = _request(62, payload=bytes(6000))
    decoder = FrameDecoder(1 << 20, scratch_bytes=8192, direct_bytes=4096, budget=budget)
    assert list(decoder.feed(frame[:100])) == []
    body_bytes = len(frame) - REQUEST_HEADER.size
    assert decoder.waiting_bytes == body_bytes and budget.used_bytes == 5000
    budget.release(5000)
    assert list(decoder.received(0)) == [] and decoder.waiting_bytes == 0 and budget.used_bytes == body_bytes
    [request] = decoder.feed(frame[100:])
    assert request.correlation_id == 62 and budget.used_bytes == 0


def test_closing_a_decoder_mid_frame_gives_back_its_reservation_and_receive_buffer():
    """A connection lost mid-frame: a large frame's reservation goes back to the budget, a small
    frame's receive buffer back to the pool."""
    budget = ByteBudget("queued.max.request.bytes", 100_000)
    pool = ScratchPool(8192, max_free=4)
    large = FrameDecoder(1 << 20, direct_bytes=4096, carry_bytes=64, pool=pool, budget=budget)
    list(large.feed(_request(63, payload=bytes(6000))[:5000]))
    large.close()
    assert budget.used_bytes == 0 and large.buffered_bytes == 0
    small = FrameDecoder(1 << 20, direct_bytes=4096, carry_bytes=64, pool=pool, budget=budget)
    list(small.feed(_request(64, payload=bytes(3000))[:2000]))
    assert pool.free_buffers == 0
    small.close()
    assert pool.free_buffers == 1 and small.buffered_bytes == 0


@pytest.mark.parametrize("cut, holds_buffer", [(None, False), (10, False), (2000, True)],
                         ids=["whole-frame", "small-start-carried", "large-start-kept"])
def test_a_decoder_between_frames_holds_no_receive_buffer(cut, holds_buffer):
    """The receive buffer goes back to the shared pool after a receive unless more than
    carry_bytes of a frame are left in it (those few bytes are kept aside instead)."""
    pool = ScratchPool(8192, max_free=4)
    decoder = FrameDecoder(1 << 20, direct_bytes=4096, carry_bytes=64, pool=pool)
    frame = _request(65, payload=bytes(3000))
    delivered = list(decoder.feed(frame if cut is None else frame[:cut]))
    assert pool.free_buffers == (0 if holds_buffer else 1)
    if cut is not None:
        assert delivered == [] and decoder.buffered_bytes == cut
        [request] = decoder.feed(frame[cut:])
        assert bytes(request.payload) == bytes(3000) and pool.free_buffers == 1


@pytest.mark.parametrize("held, asked, taken", [(0, 50, True), (0, 500, True), (40, 60, True), (40, 61, False),
                                                (100, 1, False)],
                         ids=["fits", "larger-than-the-limit-when-nothing-is-used", "fills-the-limit",
                              "past-the-limit", "spent"])
def test_try_reserve_takes_what_fits_under_the_limit(held, asked, taken):
    budget = ByteBudget("b", 100)
    budget.acquire(held)
    assert budget.try_reserve(asked) is taken
    assert budget.used_bytes == held + (asked if taken else 0)


def test_reservations_gate_each_other_but_never_stop_every_connection():
    """Reserved bytes (frames announced, not yet received) count against the limit for further
    reservations, but only held requests make the budget exhausted (which mutes everyone)."""
    budget = ByteBudget("b", 100)
    assert budget.try_reserve(100) and not budget.exhausted
    assert not budget.try_reserve(1)
    budget.acquire(100)
    assert budget.exhausted
    budget.unreserve(100)
    assert budget.used_bytes == 100 and budget.exhausted


_CONTROL_VALUES = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=10), st.binary(max_size=10), st.booleans(), st.none(),
    st.lists(st.integers(0, 100), max_size=3),
)
_FRAMES = st.lists(
    st.tuples(
        st.sampled_from(list(ApiKey)),
        st.integers(0, 3),
        st.integers(-(2**31), 2**31 - 1),
        st.dictionaries(st.text(max_size=8), _CONTROL_VALUES, max_size=4),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=8,
)


# (scratch_bytes, direct_bytes): the defaults, and small enough that frames go every way: copied
# out of the scratch, moved to its front, and received in place.
_READER_SIZES = [(256 << 10, 64 << 10), (64, 32), (160, 40)]


@pytest.mark.parametrize("sizes", _READER_SIZES, ids=lambda s: f"scratch_{s[0]}_direct_{s[1]}")
@PROPERTY
@given(frames=_FRAMES, data=st.data())
def test_random_frames_split_at_random_points_decode_identically(sizes, frames, data):
    """Any sequence of frames, oversize ones included, cut at any points, decodes to the same
    requests and oversize announcements as the unsplit stream would, whatever the buffer sizes."""
    limit = 200
    encoded = [encode_request(k, v, c, ctl, len(p)) + p for k, v, c, ctl, p in frames]
    expected = [
        ("oversize", k, c, len(e)) if len(e) > limit else ("request", k, v, c, ctl, p)
        for (k, v, c, ctl, p), e in zip(frames, encoded)
    ]
    stream = b"".join(encoded)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    decoder = FrameDecoder(limit, scratch_bytes=sizes[0], direct_bytes=sizes[1])
    assert _feed_all(decoder, chunks) == expected
    assert decoder.buffered_bytes == 0


# -- ResponseDecoder ------------------------------------------------------------------------------


def test_response_round_trips_through_encode_response_and_decoder():
    """encode_response + payload, split anywhere, decodes to the same correlation id, control and payload."""
    frame = encode_response(77, {"error_code": 0, "topics": [{"name": "t"}]}, 4) + b"DATA"
    for cut in range(len(frame) + 1):
        decoder = ResponseDecoder(1 << 20)
        out = [*decoder.feed(frame[:cut]), *decoder.feed(frame[cut:])]
        assert [(r.correlation_id, r.control, bytes(r.payload)) for r in out] == [
            (77, {"error_code": 0, "topics": [{"name": "t"}]}, b"DATA")
        ]


def test_pipelined_responses_decode_in_order():
    """Several responses in one chunk come out in order with their own payloads."""
    stream = b"".join(encode_response(i, {"i": i}, i) + bytes([i]) * i for i in range(5))
    out = list(ResponseDecoder(1 << 20).feed(stream))
    assert [(r.correlation_id, r.control["i"], bytes(r.payload)) for r in out] == [(i, i, bytes([i]) * i) for i in range(5)]


@pytest.mark.parametrize("sizes", _READER_SIZES, ids=lambda s: f"scratch_{s[0]}_direct_{s[1]}")
@PROPERTY
@given(responses=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=300)), min_size=1, max_size=8),
       data=st.data())
def test_random_responses_split_at_random_points_decode_identically(sizes, responses, data):
    """Responses cut at any points decode to the same frames whatever the buffer sizes."""
    stream = b"".join(encode_response(c, {"n": len(p)}, len(p)) + p for c, p in responses)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    decoder = ResponseDecoder(1 << 20, scratch_bytes=sizes[0], direct_bytes=sizes[1])
    out = [r for a, b in zip([0, *cuts], [*cuts, len(stream)]) for r in decoder.feed(stream[a:b])]
    assert [(r.correlation_id, r.control, bytes(r.payload)) for r in out] == [(c, {"n": len(p)}, p) for c, p in responses]
    assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("size", [-1, 7, 10_000], ids=["negative", "below_header", "over_limit"])
def test_response_size_outside_bounds_raises_invalid_request(size):
    """A response frame whose size is negative, too small or over the limit raises INVALID_REQUEST."""
    with pytest.raises(InvalidRequestError):
        list(ResponseDecoder(1_000).feed(struct.pack(">iii", size, 1, 0) + b"\x80" * 20))


def test_response_control_length_outside_frame_raises_invalid_request():
    """A response control_length past the frame end raises INVALID_REQUEST."""
    frame = struct.pack(">iii", 9, 1, 50) + b"\x80"
    with pytest.raises(InvalidRequestError):
        list(ResponseDecoder(1_000).feed(frame))


def test_response_with_undecodable_control_raises_invalid_request():
    """A response whose control bytes are not msgpack raises INVALID_REQUEST, like other bad framing."""
    frame = struct.pack(">iii", 9, 1, 1) + b"\xc1"
    with pytest.raises(InvalidRequestError):
        list(ResponseDecoder(1_000).feed(frame))


# -- control fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "control, kind, expected",
    [
        ({"x": 5}, int, 5),
        ({"x": "t"}, str, "t"),
        ({"x": True}, bool, True),
        ({"x": b"b"}, bytes, b"b"),
        ({"x": [1]}, list, [1]),
        ({"x": 5}, (int, str), 5),
    ],
    ids=["int", "str", "bool", "bytes", "list", "tuple_kind"],
)
def test_field_returns_values_of_the_requested_type(control, kind, expected):
    """field returns the value when it has the requested type."""
    assert field(control, "x", kind) == expected


@pytest.mark.parametrize(
    "control, kind",
    [({"x": True}, int), ({"x": False}, int), ({"x": "5"}, int), ({"x": 5}, str), ({"x": 1.5}, int), ({"x": {}}, list)],
    ids=["true_as_int", "false_as_int", "str_as_int", "int_as_str", "float_as_int", "map_as_list"],
)
def test_field_of_the_wrong_type_raises_invalid_request(control, kind):
    """A value of the wrong type, including a bool where an int is expected, is INVALID_REQUEST."""
    with pytest.raises(InvalidRequestError, match="'x'"):
        field(control, "x", kind)


def test_field_rejects_bool_for_a_tuple_kind_containing_int():
    """bool is not int even when int is one of several accepted kinds."""
    with pytest.raises(InvalidRequestError):
        field({"x": True}, "x", (int, str))


def test_missing_or_null_field_uses_default_or_raises():
    """An absent or null field returns the default if given, otherwise raises INVALID_REQUEST."""
    assert field({}, "x", int, 9) == 9
    assert field({"x": None}, "x", int, 9) == 9
    assert field({}, "x", int, None) is None
    with pytest.raises(InvalidRequestError, match="missing"):
        field({}, "x", int)
    with pytest.raises(InvalidRequestError, match="missing"):
        field({"x": None}, "x", int)


def test_entries_returns_a_list_of_maps():
    """entries returns the list when every item is a map (an empty list is fine)."""
    assert entries({"topics": [{"name": "a"}, {}]}, "topics") == [{"name": "a"}, {}]
    assert entries({"topics": []}, "topics") == []


@pytest.mark.parametrize(
    "control",
    [{}, {"topics": {"name": "a"}}, {"topics": [{"name": "a"}, "b"]}, {"topics": [[]]}],
    ids=["missing", "map_not_list", "string_item", "list_item"],
)
def test_entries_that_are_not_a_list_of_maps_raise_invalid_request(control):
    """A missing list, a non-list, or an item that is not a map is INVALID_REQUEST."""
    with pytest.raises(InvalidRequestError):
        entries(control, "topics")
