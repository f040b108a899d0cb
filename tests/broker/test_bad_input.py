"""Bad input over real TCP against a real broker process (docs/architecture.md, Wire protocol: "bad input gets a
clear error and never crashes the broker or touches stored data").

Every case proves three things: (a) the response carries the named error code, (b) the broker
still serves Metadata on a fresh connection and, where the connection should survive, on the
same one, and (c) no stored byte changed: the topic's partition files keep their sizes and
sha256, and fetching returns exactly the seeded records.

One broker serves the whole module (each case gets its own topic), configured with small frame
limits so that the framing limits can be hit cheaply, and with time-based flushing off so that
the partition files only ever change when something is appended.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import crc32c
import msgpack
import pyarrow as pa
import pytest

from segment_format import batch_body, record
from common.errors import (
    NONE,
    CorruptMessageError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRecordError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    InvalidTimestampError,
    InvalidTopicError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from protocol import ApiKey
from tests.broker.forged_batches import FORGED_BATCHES, compacted
from tests.helpers.raw_produce import (
    INT64_MAX,
    SEED_VALUES,
    TS,
    assert_metadata,
    assert_serving,
    create_topic,
    fetch_records,
    fetch_request,
    make_batch,
    produce,
    produce_request,
    stored_files,
)
from tests.waiting import wait_until

SOCKET_REQUEST_MAX_BYTES = 65536
MESSAGE_MAX_BYTES = 32768  # socket.request.max.bytes must exceed it by 1024
_names = itertools.count()


# -- the broker and its topics ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(module_broker_factory):
    """One broker for the module: small frame limits; no time-based flush (files change only on append)."""
    return module_broker_factory(
        "bad-input",
        **{
            "socket.request.max.bytes": SOCKET_REQUEST_MAX_BYTES,
            "message.max.bytes": MESSAGE_MAX_BYTES,
            "log.flush.interval.ms": INT64_MAX,
        },
    ).start()


@pytest.fixture
def client(server, raw_client):
    return raw_client(server.port)


class Seeded:
    """A topic holding SEED_VALUES in partition 0, with a fingerprint of its stored files."""

    def __init__(self, server, client, name: str) -> None:
        self.name = name
        self.log_dir: Path = server.log_dir
        self.files = stored_files(self.log_dir, name)
        self.records = fetch_records(client, name)
        assert self.records == list(enumerate(SEED_VALUES))
        assert self.files, "the seeded partition has no files"

    def assert_untouched(self, client) -> None:
        assert stored_files(self.log_dir, self.name) == self.files, "stored partition files changed"
        assert fetch_records(client, self.name) == self.records


@pytest.fixture
def topic(server, client) -> Seeded:
    """A fresh one-partition topic seeded with three records."""
    name = f"t{next(_names)}"
    create_topic(client, name)
    result = produce(client, name, 0, make_batch(SEED_VALUES))
    assert result["error_code"] == NONE and result["base_offset"] == 0
    return Seeded(server, client, name)


# -- helpers ------------------------------------------------------------------------------------


def log_dir_state(log_dir: Path) -> tuple[list[str], str]:
    """The log dir's entries and the metadata file's sha256: what a failed admin call must not change."""
    entries = sorted(p.name for p in log_dir.iterdir())
    metadata = log_dir / "__cluster_metadata.json"
    digest = hashlib.sha256(metadata.read_bytes()).hexdigest() if metadata.exists() else ""
    return entries, digest


def recrc(buf: bytearray) -> bytearray:
    """Recompute the CRC after a header change, so that the check under test (not the CRC) fires."""
    struct.pack_into("<I", buf, 17, crc32c.crc32c(bytes(buf[record.CRC_START :])))
    return buf


def topic_error(reply: dict[str, Any]) -> int:
    assert reply["error_code"] == NONE, reply
    return reply["topics"][0]["error_code"]


def partition_error(reply: dict[str, Any]) -> int:
    assert reply["error_code"] == NONE, reply
    return reply["topics"][0]["partitions"][0]["error_code"]


def first_error(reply: dict[str, Any]) -> int:
    """The request's error code if it failed whole, else its first topic's (or that topic's first
    partition's) code: for cases where refusing the whole request or one item are both right."""
    if reply["error_code"] != NONE:
        return reply["error_code"]
    item = reply["topics"][0]
    if item.get("error_code", NONE) != NONE or not item.get("partitions"):
        return item.get("error_code", NONE)
    return item["partitions"][0]["error_code"]


# -- Produce: corrupt batches (CORRUPT_MESSAGE, nothing stored) ----------------------------------


def _set(fmt: str, offset: int, value: int) -> Callable[[bytearray], bytearray]:
    def mutate(buf: bytearray) -> bytearray:
        struct.pack_into(fmt, buf, offset, value)
        return buf
    return mutate


def _set_recrc(fmt: str, offset: int, value: int) -> Callable[[bytearray], bytearray]:
    return lambda buf: recrc(_set(fmt, offset, value)(buf))


def _flip_last_body_byte(buf: bytearray) -> bytearray:
    buf[-1] ^= 0xFF
    return buf


def _body_not_arrow(buf: bytearray) -> bytearray:
    buf[record.HEADER_SIZE :] = random.Random(7).randbytes(len(buf) - record.HEADER_SIZE)
    buf[record.HEADER_SIZE : record.HEADER_SIZE + 4] = b"PAR1"
    return recrc(buf)


def _counts(record_count: int, last_offset_delta: int) -> Callable[[bytearray], bytearray]:
    def mutate(buf: bytearray) -> bytearray:
        struct.pack_into("<i", buf, 23, last_offset_delta)
        struct.pack_into("<i", buf, 57, record_count)
        return recrc(buf)
    return mutate


CORRUPT_BATCHES = [
    # id, mutation of a valid 3-record batch, words the error message must contain
    ("crc-body-byte-flipped", _flip_last_body_byte, "CRC"),
    ("crc-field-wrong", lambda b: _set("<I", 17, (struct.unpack_from("<I", b, 17)[0] + 1) % 2**32)(b), "CRC"),
    ("magic-0", _set("<b", 16, 0), "magic"),
    ("magic-2", _set("<b", 16, 2), "magic"),
    ("batch-length-larger-than-data", lambda b: _set("<i", 8, len(b) - 12 + 1)(b), "present"),
    ("batch-length-smaller-than-data", lambda b: _set("<i", 8, len(b) - 12 - 8)(b), "CRC"),
    ("batch-length-below-header", _set("<i", 8, 20), "too small"),
    ("batch-length-negative", _set("<i", 8, -1), "too small"),
    ("truncated-body", lambda b: b[: len(b) - 20], "present"),
    ("truncated-header", lambda b: b[:40], "truncated batch header"),
    ("reserved-attribute-bit-0", _set_recrc("<h", 21, 1), "reserved attribute"),
    ("reserved-attribute-bit-15", _set_recrc("<h", 21, -0x8000), "reserved attribute"),
    ("record-count-above-delta", _counts(4, 2), "record_count"),
    ("record-count-zero", _counts(0, -1), "record_count"),
    ("record-count-negative", _counts(-3, -4), "record_count"),
    ("max-timestamp-before-base", _set_recrc("<q", 35, TS - 1), "max_timestamp"),
    ("body-not-arrow-ipc", _body_not_arrow, "Arrow IPC"),
    ("trailing-bytes-after-batch", lambda b: b + b"\x00" * 5, "truncated batch header"),
    ("zero-length-payload", lambda b: b"", "empty record set"),
]


@pytest.mark.parametrize("mutate, words", [c[1:] for c in CORRUPT_BATCHES], ids=[c[0] for c in CORRUPT_BATCHES])
def test_produce_of_a_corrupt_batch_is_rejected_and_stores_nothing(server, raw_client, client, topic, mutate, words):
    """A batch broken in one field gets CORRUPT_MESSAGE naming the field; the log is unchanged."""
    result = produce(client, topic.name, 0, bytes(mutate(make_batch([b"a", b"b", b"c"]))))
    assert result["error_code"] == CorruptMessageError.code, result
    assert words in result["error_message"]
    assert result["base_offset"] == -1
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


@pytest.mark.parametrize("first_bad", [False, True], ids=["second-batch-bad", "first-batch-bad"])
def test_produce_of_two_batches_with_one_bad_stores_neither(server, raw_client, client, topic, first_bad):
    """All or nothing per partition: a good batch next to a corrupt one is not appended either."""
    good, bad = make_batch([b"good"]), _flip_last_body_byte(make_batch([b"bad-1", b"bad-2"]))
    payload = bad + good if first_bad else good + bad
    result = produce(client, topic.name, 0, bytes(payload))
    assert result["error_code"] == CorruptMessageError.code, result
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def test_produce_of_a_batch_above_topic_max_message_bytes_is_rejected(server, raw_client, client):
    """A 4 KB batch on a topic with max.message.bytes=2048 gets MESSAGE_TOO_LARGE; nothing stored."""
    name = f"small-{next(_names)}"
    create_topic(client, name, configs={"max.message.bytes": "2048"})
    assert produce(client, name, 0, make_batch([b"ok"]))["error_code"] == NONE
    before = stored_files(server.log_dir, name)
    batch = make_batch([random.Random(1).randbytes(4096)])
    result = produce(client, name, 0, bytes(batch))
    assert result["error_code"] == MessageTooLargeError.code, result
    assert_serving(server, raw_client, same=client)
    assert stored_files(server.log_dir, name) == before
    assert fetch_records(client, name) == [(0, b"ok")]


def test_produce_of_a_batch_above_broker_message_max_bytes_is_rejected(server, raw_client, client, topic):
    """A 40 KB batch (the frame fits socket.request.max.bytes) exceeds message.max.bytes=32 KiB."""
    batch = make_batch([random.Random(2).randbytes(40_000)])
    assert MESSAGE_MAX_BYTES < len(batch) < SOCKET_REQUEST_MAX_BYTES - 1024
    result = produce(client, topic.name, 0, bytes(batch))
    assert result["error_code"] == MessageTooLargeError.code, result
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


# -- Produce: bad addressing and bad control fields ---------------------------------------------

BAD_PARTITIONS = [
    # id, topic (None = the seeded topic), partition, expected error class
    ("unknown-topic", "no-such-topic", 0, UnknownTopicOrPartitionError),
    ("unknown-partition", None, 7, UnknownTopicOrPartitionError),
    ("negative-partition", None, -1, UnknownTopicOrPartitionError),
    ("partition-as-string", None, "0", InvalidRequestError),
    ("partition-as-bool", None, True, InvalidRequestError),
    ("partition-as-float", None, 0.0, InvalidRequestError),
    ("partition-missing", None, None, InvalidRequestError),
    ("topic-name-as-int", 5, 0, InvalidRequestError),
    ("topic-name-as-list", ["t"], 0, InvalidRequestError),
]


@pytest.mark.parametrize("name, partition, error", [c[1:] for c in BAD_PARTITIONS], ids=[c[0] for c in BAD_PARTITIONS])
def test_produce_to_a_bad_topic_partition_gets_a_partition_error(server, raw_client, client, topic, name, partition, error):
    """A valid batch aimed at a partition that does not exist (or is not an int) is refused per partition."""
    result = produce(client, topic.name if name is None else name, partition, bytes(make_batch([b"x"])))
    assert result["error_code"] == error.code, result
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def _two_partitions(topic: str, first_size: int, second_size: Any) -> dict[str, Any]:
    return {"acks": 1, "topics": [{"name": topic, "partitions": [
        {"partition": 0, "size": first_size}, {"partition": 0, "size": second_size}]}]}


BAD_PRODUCE_REQUESTS = [
    # id, control(topic, batch length) -> control map, expected top-level error class
    ("acks-2", lambda t, n: produce_request(t, 0, b"\0" * n, acks=2), InvalidRequiredAcksError),
    ("acks-minus-2", lambda t, n: produce_request(t, 0, b"\0" * n, acks=-2), InvalidRequiredAcksError),
    ("acks-as-string", lambda t, n: produce_request(t, 0, b"\0" * n, acks="all"), InvalidRequestError),
    ("acks-as-bool", lambda t, n: produce_request(t, 0, b"\0" * n, acks=True), InvalidRequestError),
    ("sizes-short-of-payload", lambda t, n: {"topics": [{"name": t, "partitions": [{"partition": 0, "size": n - 1}]}]},
     InvalidRequestError),
    ("sizes-beyond-payload", lambda t, n: _two_partitions(t, n, 1), InvalidRequestError),
    ("size-negative", lambda t, n: _two_partitions(t, n, -1), InvalidRequestError),
    ("size-as-string", lambda t, n: _two_partitions(t, n, "0"), InvalidRequestError),
    ("size-missing", lambda t, n: {"topics": [{"name": t, "partitions": [{"partition": 0}]}]}, InvalidRequestError),
    ("topics-missing", lambda t, n: {"acks": 1}, InvalidRequestError),
    ("topics-not-a-list", lambda t, n: {"topics": {"name": t}}, InvalidRequestError),
    ("topic-entry-not-a-map", lambda t, n: {"topics": [t]}, InvalidRequestError),
    ("partitions-missing", lambda t, n: {"topics": [{"name": t}]}, InvalidRequestError),
]


@pytest.mark.parametrize("control, error", [c[1:] for c in BAD_PRODUCE_REQUESTS], ids=[c[0] for c in BAD_PRODUCE_REQUESTS])
def test_produce_with_bad_control_fields_is_refused_whole(server, raw_client, client, topic, control, error):
    """Bad acks or partition sizes that do not add up to the payload fail the whole request before
    any partition is appended, even one whose own batch is valid."""
    batch = bytes(make_batch([b"valid"]))
    reply, _ = client.request(ApiKey.PRODUCE, control(topic.name, len(batch)), batch)
    assert reply["error_code"] == error.code, reply
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


# -- Framing -------------------------------------------------------------------------------------


def test_request_above_socket_request_max_bytes_is_answered_and_skipped(server, raw_client, client, topic):
    """A 70 KB produce frame (limit 64 KiB) gets MESSAGE_TOO_LARGE under its own correlation id,
    is skipped without being stored, and the same connection goes on working."""
    batch = bytes(make_batch([random.Random(3).randbytes(70_000)]))
    cid = client.send_frame(ApiKey.PRODUCE, produce_request(topic.name, 0, batch), batch, correlation_id=777)
    correlation_id, control, _ = client.recv_response()
    assert (correlation_id, control["error_code"]) == (cid, MessageTooLargeError.code), control
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def test_oversize_frame_followed_by_a_request_in_one_write_answers_both(server, raw_client, client):
    """The skipped frame's bytes are discarded exactly: the request right behind them is decoded."""
    _, big = client.frame(ApiKey.METADATA, {}, b"\0" * (SOCKET_REQUEST_MAX_BYTES + 10), correlation_id=41)
    _, small = client.frame(ApiKey.API_VERSIONS, {}, correlation_id=42)
    client.send_raw(big + small)
    first, second = client.recv_response(), client.recv_response()
    assert (first[0], first[1]["error_code"]) == (41, MessageTooLargeError.code)
    assert (second[0], second[1]["error_code"]) == (42, NONE)
    assert_serving(server, raw_client, same=client)


def _patch_control_length(value: int) -> Callable[[bytes], bytes]:
    return lambda frame: frame[:12] + struct.pack(">i", value) + frame[16:]


MALFORMED_FRAMES = [
    # id, api_key, control (dict or raw bytes), frame patch, expected error class
    ("control-not-msgpack", ApiKey.METADATA, b"\xc1\xc1\xc1", None, InvalidRequestError),
    ("control-truncated-msgpack", ApiKey.METADATA, msgpack.packb({"topics": ["abc"]})[:-2], None, InvalidRequestError),
    ("control-invalid-utf8", ApiKey.METADATA, b"\x81\xa6topics\x91\xa2\xff\xfe", None, InvalidRequestError),
    ("control-is-a-list", ApiKey.METADATA, msgpack.packb([1, 2]), None, InvalidRequestError),
    ("control-is-an-int", ApiKey.METADATA, msgpack.packb(5), None, InvalidRequestError),
    ("control-empty", ApiKey.METADATA, b"", None, InvalidRequestError),
    ("control-map-with-int-keys", ApiKey.METADATA, msgpack.packb({1: 2}), None, InvalidRequestError),
    ("control-length-beyond-frame", ApiKey.METADATA, {}, _patch_control_length(1000), InvalidRequestError),
    ("control-length-negative", ApiKey.METADATA, {}, _patch_control_length(-1), InvalidRequestError),
    ("unknown-api-key-999", 999, {}, None, InvalidRequestError),
    ("unknown-api-key-17", 17, {}, None, InvalidRequestError),
    ("api-key-negative", -1, {}, None, InvalidRequestError),
    ("metadata-version-1", ApiKey.METADATA, {}, "v1", UnsupportedVersionError),
    ("produce-version-minus-1", ApiKey.PRODUCE, {}, "v-1", UnsupportedVersionError),
    ("fetch-version-32767", ApiKey.FETCH, {}, "v32767", UnsupportedVersionError),
]


@pytest.mark.parametrize("api_key, control, patch, error", [c[1:] for c in MALFORMED_FRAMES], ids=[c[0] for c in MALFORMED_FRAMES])
def test_malformed_frame_gets_an_error_and_the_connection_survives(server, raw_client, client, topic, api_key, control, patch, error):
    """A well-sized frame with an undecodable header or control map is answered under its
    correlation id and the same connection stays usable."""
    version = int(patch[1:]) if isinstance(patch, str) else 0
    cid, frame = client.frame(api_key, control, api_version=version, correlation_id=4242)
    client.send_raw(patch(frame) if callable(patch) else frame)
    correlation_id, reply, payload = client.recv_response()
    assert (correlation_id, reply["error_code"]) == (cid, error.code), reply
    assert payload == b""
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 11], ids=["size-minus-1", "size-int32-min", "size-0", "size-below-header"])
def test_unframeable_size_closes_only_that_connection(server, raw_client, client, topic, size):
    """A frame size that cannot be resynchronized closes the connection, after answering what came
    before it in the same write; the broker goes on serving everyone else."""
    _, before = client.frame(ApiKey.API_VERSIONS, {}, correlation_id=1)
    _, bad = client.frame(ApiKey.METADATA, {}, size_override=size, correlation_id=2)
    client.send_raw(before + bad)
    correlation_id, reply, _ = client.recv_response()
    assert (correlation_id, reply["error_code"]) == (1, NONE)
    assert client.is_closed()
    assert_serving(server, raw_client)
    with raw_client(server.port) as other:
        topic.assert_untouched(other)


def test_frame_written_one_byte_at_a_time_is_decoded(server, raw_client, client):
    """A produce frame dribbled in 1-byte writes is reassembled and appended once."""
    name = f"dribble-{next(_names)}"
    create_topic(client, name)
    batch = bytes(make_batch([b"one", b"byte", b"at-a-time"]))
    cid, frame = client.frame(ApiKey.PRODUCE, produce_request(name, 0, batch), batch)
    for i in range(len(frame)):
        client.send_raw(frame[i : i + 1])
        if i % 16 == 0:
            time.sleep(0.001)  # let the broker see many partial reads
    correlation_id, reply, _ = client.recv_response()
    assert correlation_id == cid and partition_error(reply) == NONE, reply
    assert fetch_records(client, name) == [(0, b"one"), (1, b"byte"), (2, b"at-a-time")]
    assert_serving(server, raw_client, same=client)


def test_pipelined_requests_in_one_write_are_all_answered(server, raw_client, client, topic):
    """40 requests (good and bad mixed) sent in one write each get exactly one response, with
    the right correlation id and error code."""
    bad_batch = bytes(_flip_last_body_byte(make_batch([b"bad"])))
    kinds = [
        (ApiKey.METADATA, {}, b"", None, NONE),
        (ApiKey.API_VERSIONS, {}, b"", None, NONE),
        (ApiKey.LIST_OFFSETS, {"topics": [{"name": topic.name, "partitions": [{"partition": 0, "timestamp": -1}]}]},
         b"", partition_error, NONE),
        (ApiKey.PRODUCE, produce_request(topic.name, 0, bad_batch), bad_batch, partition_error, CorruptMessageError.code),
        (ApiKey.METADATA, b"\xc1", b"", None, InvalidRequestError.code),
        (999, {}, b"", None, InvalidRequestError.code),
        (ApiKey.PRODUCE, produce_request(topic.name, 0, b"", acks=2), b"", None, InvalidRequiredAcksError.code),
        (ApiKey.METADATA, {}, b"", "v9", UnsupportedVersionError.code),
    ]
    expected, frames = {}, []
    for i in range(40):
        api_key, control, payload, read, code = kinds[i % len(kinds)]
        version = int(read[1:]) if isinstance(read, str) else 0
        cid, frame = client.frame(api_key, control, payload, api_version=version, correlation_id=1000 + i)
        expected[cid] = (read if callable(read) else None, code)
        frames.append(frame)
    client.send_raw(b"".join(frames))
    seen = {}
    for _ in range(40):
        correlation_id, reply, _ = client.recv_response()
        read, code = expected[correlation_id]
        seen[correlation_id] = read(reply) if read else reply["error_code"]
        assert seen[correlation_id] == code, (correlation_id, reply)
    assert sorted(seen) == sorted(expected)
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def test_broker_serves_others_while_one_client_trickles_garbage(server, raw_client, client, topic):
    """Two clients dribbling bytes (an unfinished 60 KB frame, and random noise) for two seconds
    do not slow down Metadata and fetches on other connections."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def trickle(data: bytes) -> None:
        with raw_client(server.port) as slow:
            try:
                for i in range(len(data)):
                    if stop.is_set():
                        return
                    slow.send_raw(data[i : i + 1])
                    time.sleep(0.002)  # not a wait: the deliberately slow peer, a byte every 2 ms
            except OSError:
                return  # the broker may close a connection fed noise: that is allowed
            except BaseException as err:  # pragma: no cover - reported below
                errors.append(err)

    unfinished = struct.pack(">ihhii", 60_000, ApiKey.PRODUCE, 0, 9, 0) + random.Random(4).randbytes(60_000)
    noise = random.Random(5).randbytes(60_000)
    threads = [threading.Thread(target=trickle, args=(data,), daemon=True) for data in (unfinished, noise)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 2.0
        slowest = 0.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert_metadata(client)
            topic.assert_untouched(client)
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < 1.0, f"a Metadata + Fetch round trip took {slowest:.3f}s while garbage trickled in"
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert not errors
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def broker_rss_bytes(server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the broker's RSS from /proc")
def test_client_that_pipelines_fetches_and_never_reads_does_not_grow_broker_memory(server, raw_client, client):
    """100 pipelined 2 MB fetches sent by a client that reads nothing must not make the broker
    buffer 200 MB: once the socket's write buffer is full, responses should wait, not pile up."""
    name = f"wide-{next(_names)}"
    create_topic(client, name)
    chunk = bytes(make_batch([random.Random(6).randbytes(30_000)]))
    for _ in range(70):  # ~2 MB of log, in batches under message.max.bytes
        assert produce(client, name, 0, chunk)["error_code"] == NONE
    fetch = fetch_request(name, 0, 0) | {"max_bytes": 4 << 20}
    fetch["topics"][0]["partitions"][0]["max_bytes"] = 4 << 20
    slow = raw_client(server.port)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    before = broker_rss_bytes(server)
    slow.send_raw(b"".join(slow.frame(ApiKey.FETCH, fetch)[1] for _ in range(100)))
    deadline, growth = time.monotonic() + 5, 0
    while time.monotonic() < deadline and growth < 64 << 20:  # sampled for 5 s: what must not happen
        time.sleep(0.1)
        growth = broker_rss_bytes(server) - before
    slow.close()
    assert_serving(server, raw_client, same=client)
    assert growth < 64 << 20, f"broker RSS grew by {growth >> 20} MiB for one client that does not read"


# -- Fetch ---------------------------------------------------------------------------------------

BAD_FETCHES = [
    # id, topic (None = seeded), partition, fetch_offset, expected partition error class (None = NONE)
    ("offset-at-log-end-is-empty", None, 0, 3, None),
    ("offset-past-log-end", None, 0, 4, OffsetOutOfRangeError),
    ("offset-far-past-log-end", None, 0, 2**62, OffsetOutOfRangeError),
    ("offset-int64-max", None, 0, INT64_MAX, OffsetOutOfRangeError),
    ("offset-minus-1", None, 0, -1, OffsetOutOfRangeError),
    ("offset-int64-min", None, 0, -(2**63), OffsetOutOfRangeError),
    ("unknown-topic", "no-such-topic", 0, 0, UnknownTopicOrPartitionError),
    ("unknown-partition", None, 3, 0, UnknownTopicOrPartitionError),
    ("negative-partition", None, -1, 0, UnknownTopicOrPartitionError),
    ("partition-as-string", None, "0", 0, InvalidRequestError),
    ("topic-name-as-int", 17, 0, 0, InvalidRequestError),
]


@pytest.mark.parametrize("name, partition, offset, error", [c[1:] for c in BAD_FETCHES], ids=[c[0] for c in BAD_FETCHES])
def test_fetch_outside_the_log_gets_a_partition_error(server, raw_client, client, topic, name, partition, offset, error):
    """Offsets outside [log start, log end], unknown partitions and mistyped addresses are refused
    per partition, at once (no long poll), with no data."""
    control = fetch_request(topic.name if name is None else name, partition, offset)
    if error is not None:  # an error must answer at once even when the fetch asks to wait for data
        control |= {"max_wait_ms": 5000, "min_bytes": 1}
    started = time.monotonic()
    reply, payload = client.request(ApiKey.FETCH, control)
    entry = reply["topics"][0]["partitions"][0]
    if error is None:
        assert entry["error_code"] == NONE and entry["size"] == 0 and payload == b"", reply
    else:
        assert partition_error(reply) == error.code, reply
        assert payload == b"" and time.monotonic() - started < 2.0
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def test_fetch_with_a_list_as_topic_name_gets_invalid_request(server, raw_client, client, topic):
    """A topic name that is a msgpack array is a malformed address: INVALID_REQUEST, not a crash."""
    reply, _ = client.request(ApiKey.FETCH, fetch_request([topic.name], 0, 0))
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)
    assert first_error(reply) == InvalidRequestError.code, reply


BAD_FETCH_FIELDS = [
    ("fetch-offset-as-string", {"fetch_offset": "0"}, None),
    ("fetch-offset-as-float", {"fetch_offset": 0.0}, None),
    ("fetch-offset-missing", {"fetch_offset": None}, None),
    ("partition-max-bytes-as-string", {"max_bytes": "1"}, None),
    ("max-wait-ms-as-string", None, {"max_wait_ms": "100"}),
    ("min-bytes-as-bool", None, {"min_bytes": True}),
    ("topics-missing", None, {"topics": None}),
    ("partitions-not-a-list", None, {"topics": [{"name": "x", "partitions": 0}]}),
]


@pytest.mark.parametrize("partition_fields, request_fields", [c[1:] for c in BAD_FETCH_FIELDS], ids=[c[0] for c in BAD_FETCH_FIELDS])
def test_fetch_with_mistyped_fields_gets_invalid_request(server, raw_client, client, topic, partition_fields, request_fields):
    """A field of the wrong type fails the whole fetch with INVALID_REQUEST."""
    control = fetch_request(topic.name, 0, 0)
    control["topics"][0]["partitions"][0].update(partition_fields or {})
    control.update(request_fields or {})
    reply, payload = client.request(ApiKey.FETCH, control)
    assert reply["error_code"] == InvalidRequestError.code and payload == b"", reply
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


# -- ListOffsets ---------------------------------------------------------------------------------

BAD_LIST_OFFSETS = [
    ("unknown-partition", None, 1, -1, UnknownTopicOrPartitionError),
    ("unknown-topic", "no-such-topic", 0, -1, UnknownTopicOrPartitionError),
    ("negative-partition", None, -1, -2, UnknownTopicOrPartitionError),
    ("timestamp-minus-3", None, 0, -3, InvalidRequestError),
    ("timestamp-int64-min", None, 0, -(2**63), InvalidRequestError),
    ("timestamp-as-string", None, 0, "latest", InvalidRequestError),
    ("timestamp-missing", None, 0, None, InvalidRequestError),
    ("partition-as-string", None, "0", -1, InvalidRequestError),
]


@pytest.mark.parametrize("name, partition, timestamp, error", [c[1:] for c in BAD_LIST_OFFSETS], ids=[c[0] for c in BAD_LIST_OFFSETS])
def test_list_offsets_with_a_bad_partition_or_timestamp_gets_a_partition_error(server, raw_client, client, topic, name, partition, timestamp, error):
    """Unknown partitions and timestamps that are neither -1, -2 nor a time are refused per partition."""
    control = {"topics": [{"name": topic.name if name is None else name,
                           "partitions": [{"partition": partition, "timestamp": timestamp}]}]}
    reply, _ = client.request(ApiKey.LIST_OFFSETS, control)
    assert partition_error(reply) == error.code, reply
    assert reply["topics"][0]["partitions"][0]["offset"] == -1
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


# -- Admin ---------------------------------------------------------------------------------------


def create_reply(client, item: dict[str, Any]) -> dict[str, Any]:
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [{"replication_factor": 1, "num_partitions": 1} | item]})
    return reply


def assert_topic_absent(client, name: Any) -> None:
    if isinstance(name, str):
        reply, _ = client.request(ApiKey.METADATA, {"topics": [name]})
        assert topic_error(reply) == UnknownTopicOrPartitionError.code, reply


INVALID_TOPIC_NAMES = [
    ("empty", ""),
    ("slash", "a/b"),
    ("dot", "."),
    ("dot-dot", ".."),
    ("250-chars", "x" * 250),
    ("spaces", "spaces here"),
    ("non-ascii", "t\u00f6pic"),
    ("nul-byte", "a\x00b"),
    ("int", 5),
    ("missing", None),
]


@pytest.mark.parametrize("name", [c[1] for c in INVALID_TOPIC_NAMES], ids=[c[0] for c in INVALID_TOPIC_NAMES])
def test_create_topic_with_an_invalid_name_gets_invalid_topic(server, raw_client, client, name):
    """Names outside Kafka's rules get INVALID_TOPIC_EXCEPTION and create nothing on disk."""
    before = log_dir_state(server.log_dir)
    reply = create_reply(client, {} if name is None else {"name": name})
    assert topic_error(reply) == InvalidTopicError.code, reply
    assert log_dir_state(server.log_dir) == before
    assert_topic_absent(client, name)
    assert_serving(server, raw_client, same=client)


def test_create_of_an_existing_topic_gets_already_exists_and_changes_nothing(server, raw_client, client, topic):
    """Creating the seeded topic again (with other partitions and configs) is refused; its data,
    partition count and configs stay as they were."""
    configs_before = describe_configs(client, topic.name)
    reply = create_reply(client, {"name": topic.name, "num_partitions": 4, "configs": {"retention.ms": "1"}})
    assert topic_error(reply) == TopicAlreadyExistsError.code, reply
    assert describe_configs(client, topic.name) == configs_before
    metadata, _ = client.request(ApiKey.METADATA, {"topics": [topic.name]})
    assert len(metadata["topics"][0]["partitions"]) == 1
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


BAD_NEW_TOPICS = [
    # id, CreateTopics item fields, expected error class
    ("partitions-0", {"num_partitions": 0}, InvalidPartitionsError),
    ("partitions-minus-2", {"num_partitions": -2}, InvalidPartitionsError),
    ("partitions-10001", {"num_partitions": 10_001}, InvalidPartitionsError),
    ("partitions-as-string", {"num_partitions": "3"}, InvalidRequestError),
    ("replication-factor-3", {"replication_factor": 3}, InvalidReplicationFactorError),
    ("replication-factor-0", {"replication_factor": 0}, InvalidReplicationFactorError),
    ("unknown-config-key", {"configs": {"no.such.config": "1"}}, InvalidConfigError),
    ("retention-ms-abc", {"configs": {"retention.ms": "abc"}}, InvalidConfigError),
    ("retention-ms-fraction", {"configs": {"retention.ms": "1.5"}}, InvalidConfigError),
    ("cleanup-policy-shred", {"configs": {"cleanup.policy": "shred"}}, InvalidConfigError),
    ("segment-bytes-below-minimum", {"configs": {"segment.bytes": "100"}}, InvalidConfigError),
    ("segment-plus-message-bytes-overflow-int32",
     {"configs": {"segment.bytes": str(2**31 - 1), "max.message.bytes": str(2**20)}}, InvalidConfigError),
    ("config-value-as-map", {"configs": {"retention.ms": {"v": 1}}}, InvalidConfigError),
    ("configs-not-a-map", {"configs": ["retention.ms"]}, InvalidRequestError),
]


@pytest.mark.parametrize("fields, error", [c[1:] for c in BAD_NEW_TOPICS], ids=[c[0] for c in BAD_NEW_TOPICS])
def test_create_topic_with_bad_settings_is_refused_and_creates_nothing(server, raw_client, client, fields, error):
    """Bad partition counts, replication factors and configs get their named code; no topic, no files."""
    name = f"refused-{next(_names)}"
    before = log_dir_state(server.log_dir)
    reply = create_reply(client, {"name": name} | fields)
    assert topic_error(reply) == error.code, reply
    assert log_dir_state(server.log_dir) == before
    assert_topic_absent(client, name)
    assert_serving(server, raw_client, same=client)


BAD_PARTITION_COUNTS = [
    ("equal", None, 1, InvalidPartitionsError),
    ("decreasing", None, 0, InvalidPartitionsError),
    ("negative", None, -1, InvalidPartitionsError),
    ("above-maximum", None, 10_001, InvalidPartitionsError),
    ("count-as-string", None, "2", InvalidRequestError),
    ("unknown-topic", "no-such-topic", 2, UnknownTopicOrPartitionError),
]


@pytest.mark.parametrize("name, count, error", [c[1:] for c in BAD_PARTITION_COUNTS], ids=[c[0] for c in BAD_PARTITION_COUNTS])
def test_create_partitions_that_do_not_grow_the_topic_are_refused(server, raw_client, client, topic, name, count, error):
    """CreatePartitions can only grow a topic: equal or smaller counts get INVALID_PARTITIONS."""
    before = log_dir_state(server.log_dir)
    reply, _ = client.request(ApiKey.CREATE_PARTITIONS, {"topics": [{"name": topic.name if name is None else name, "count": count}]})
    assert topic_error(reply) == error.code, reply
    assert log_dir_state(server.log_dir) == before
    metadata, _ = client.request(ApiKey.METADATA, {"topics": [topic.name]})
    assert len(metadata["topics"][0]["partitions"]) == 1
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def describe_configs(client, name: Any) -> dict[str, Any]:
    reply, _ = client.request(ApiKey.DESCRIBE_CONFIGS, {"topics": [name]})
    assert topic_error(reply) == NONE, reply
    return {c["name"]: (c["value"], c["source"]) for c in reply["topics"][0]["configs"]}


BAD_CONFIG_CHANGES = [
    ("retention-ms-abc", {"set": {"retention.ms": "abc"}}),
    ("cleanup-policy-shred", {"set": {"cleanup.policy": "shred"}}),
    ("unknown-key", {"set": {"no.such.config": "1"}}),
    ("valid-and-invalid-together", {"set": {"retention.ms": "1000", "segment.bytes": "1"}}),
    ("delete-unknown-key", {"delete": ["no.such.config"]}),
    ("timestamp-type-lowercase", {"set": {"message.timestamp.type": "logappendtime"}}),
]


@pytest.mark.parametrize("change", [c[1] for c in BAD_CONFIG_CHANGES], ids=[c[0] for c in BAD_CONFIG_CHANGES])
def test_alter_configs_with_an_invalid_change_keeps_the_old_config(server, raw_client, client, topic, change):
    """An invalid AlterConfigs gets INVALID_CONFIG and applies nothing, not even its valid keys."""
    before = describe_configs(client, topic.name)
    metadata_before = log_dir_state(server.log_dir)
    reply, _ = client.request(ApiKey.ALTER_CONFIGS, {"topics": [{"name": topic.name} | change]})
    assert topic_error(reply) == InvalidConfigError.code, reply
    assert describe_configs(client, topic.name) == before
    assert log_dir_state(server.log_dir) == metadata_before
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


@pytest.mark.parametrize("api_key", [ApiKey.ALTER_CONFIGS, ApiKey.DELETE_TOPICS, ApiKey.DESCRIBE_CONFIGS, ApiKey.CREATE_PARTITIONS],
                         ids=["alter-configs", "delete-topics", "describe-configs", "create-partitions"])
def test_admin_call_on_an_unknown_topic_gets_unknown_topic(server, raw_client, client, api_key):
    """Admin calls naming a topic that does not exist get UNKNOWN_TOPIC_OR_PARTITION."""
    name = f"never-created-{next(_names)}"
    control = {
        ApiKey.ALTER_CONFIGS: {"topics": [{"name": name, "set": {"retention.ms": "1000"}}]},
        ApiKey.DELETE_TOPICS: {"topics": [name]},
        ApiKey.DESCRIBE_CONFIGS: {"topics": [name]},
        ApiKey.CREATE_PARTITIONS: {"topics": [{"name": name, "count": 2}]},
    }[api_key]
    before = log_dir_state(server.log_dir)
    reply, _ = client.request(api_key, control)
    assert topic_error(reply) == UnknownTopicOrPartitionError.code, reply
    assert log_dir_state(server.log_dir) == before
    assert_serving(server, raw_client, same=client)


INVALID = (InvalidRequestError.code,)
UNHASHABLE_NAMES = [
    # id, api_key, control(seeded topic name) -> control map, acceptable error codes
    ("describe-configs-name-list", ApiKey.DESCRIBE_CONFIGS, lambda t: {"topics": [[t]]}, INVALID),
    ("alter-configs-name-list", ApiKey.ALTER_CONFIGS, lambda t: {"topics": [{"name": [t], "set": {}}]}, INVALID),
    ("alter-configs-delete-list-item", ApiKey.ALTER_CONFIGS, lambda t: {"topics": [{"name": t, "delete": [["retention.ms"]]}]},
     INVALID + (InvalidConfigError.code,)),  # not a config name either
    ("create-partitions-name-list", ApiKey.CREATE_PARTITIONS, lambda t: {"topics": [{"name": [t], "count": 2}]}, INVALID),
    ("create-partitions-name-map", ApiKey.CREATE_PARTITIONS, lambda t: {"topics": [{"name": {"n": t}, "count": 2}]}, INVALID),
]


@pytest.mark.parametrize("api_key, control, codes", [c[1:] for c in UNHASHABLE_NAMES], ids=[c[0] for c in UNHASHABLE_NAMES])
def test_admin_call_with_an_unhashable_name_gets_invalid_request(server, raw_client, client, topic, api_key, control, codes):
    """A topic name or config key that is a msgpack array/map is refused per topic with INVALID_REQUEST."""
    before = describe_configs(client, topic.name)
    reply, _ = client.request(api_key, control(topic.name))
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)
    assert describe_configs(client, topic.name) == before
    assert first_error(reply) in codes, reply


def test_delete_topics_with_unknown_and_mistyped_names_deletes_nothing(server, raw_client, client, topic):
    """DeleteTopics answers per name: unknown -> UNKNOWN_TOPIC_OR_PARTITION, not a string ->
    INVALID_REQUEST; the seeded topic next to them is not touched."""
    before = log_dir_state(server.log_dir)
    reply, _ = client.request(ApiKey.DELETE_TOPICS, {"topics": ["no-such-topic", 7, [topic.name]]})
    assert reply["error_code"] == NONE, reply
    assert [t["error_code"] for t in reply["topics"]] == [
        UnknownTopicOrPartitionError.code, InvalidRequestError.code, InvalidRequestError.code]
    assert log_dir_state(server.log_dir) == before
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)


def is_wire_code(code: int) -> bool:
    """A named broker error code: in the taxonomy, not a client-only (>= 1000) code, not a crash."""
    return code == NONE or (code < 1000 and code != UnknownServerError.code and error_for_code(code).code == code)


def stored_metadata_keys(log_dir: Path, topic: str) -> list[str]:
    with open(log_dir / "__cluster_metadata.json") as f:
        return sorted(k for k in json.load(f)["keys"] if k in (f"topics/{topic}",) or k.startswith(f"partitions/{topic}/"))


def assert_topic_consistent(server, client, name: str) -> None:
    """Metadata, partition dirs and stored metadata keys agree on the topic's partitions."""
    reply, _ = client.request(ApiKey.METADATA, {"topics": [name]})
    entry = reply["topics"][0]
    count = len(entry["partitions"]) if entry["error_code"] == NONE else 0
    dirs = sorted(p.name for p in server.log_dir.iterdir() if re.fullmatch(rf"{re.escape(name)}-\d+", p.name))
    assert dirs == sorted(f"{name}-{p}" for p in range(count)), (entry, dirs)
    expected_keys = sorted([f"topics/{name}"] * bool(count) + [f"partitions/{name}/{p}" for p in range(count)])
    assert stored_metadata_keys(server.log_dir, name) == expected_keys


CONCURRENT_ADMIN = [
    # id, create the topic first?, pipelined requests(name) -> [(api_key, control)]
    ("create-twice", False, lambda n: [
        (ApiKey.CREATE_TOPICS, {"topics": [{"name": n, "num_partitions": 1, "replication_factor": 1}]}),
        (ApiKey.CREATE_TOPICS, {"topics": [{"name": n, "num_partitions": 3, "replication_factor": 1}]})]),
    ("alter-then-delete", True, lambda n: [
        (ApiKey.ALTER_CONFIGS, {"topics": [{"name": n, "set": {"retention.ms": "1000"}}]}),
        (ApiKey.DELETE_TOPICS, {"topics": [n]})]),
    ("grow-then-delete", True, lambda n: [
        (ApiKey.CREATE_PARTITIONS, {"topics": [{"name": n, "count": 3}]}),
        (ApiKey.DELETE_TOPICS, {"topics": [n]})]),
]


@pytest.mark.parametrize("precreate, requests", [c[1:] for c in CONCURRENT_ADMIN], ids=[c[0] for c in CONCURRENT_ADMIN])
def test_pipelined_admin_requests_on_one_topic_get_named_codes_and_leave_it_consistent(server, raw_client, client, precreate, requests):
    """Admin requests on one topic sent in one write (they run concurrently) each get a named wire
    code, and afterwards Metadata, partition dirs and stored metadata agree."""
    name = f"raced-{next(_names)}"
    if precreate:
        create_topic(client, name)
    frames = [client.frame(api_key, control, correlation_id=i) for i, (api_key, control) in enumerate(requests(name))]
    client.send_raw(b"".join(frame for _, frame in frames))
    replies = dict(client.recv_response()[:2] for _ in frames)
    codes = [topic_error(replies[i]) for i in range(len(frames))]
    assert_serving(server, raw_client, same=client)
    assert_topic_consistent(server, client, name)
    assert all(is_wire_code(code) for code in codes), replies
    if not precreate:
        assert sorted(codes) == sorted([NONE, TopicAlreadyExistsError.code]), replies


# -- Produce: poison a CRC-valid header hides (issue 6: INVALID_TIMESTAMP or CORRUPT_MESSAGE) -----


def _framed(ipc: bytes, record_count: int = 3, ts: int = TS) -> bytes:
    return bytes(record.frame_body(ipc, record_count=record_count, base_timestamp=ts, max_timestamp=ts))


def _ipc_of(values: list[bytes], ts: int = TS) -> bytes:
    return batch_body.encode_body(batch_body.make_body(values, timestamps_ms=ts)).to_pybytes()


def _foreign_schema_body() -> bytes:
    other = batch_body.make_body([b"a", b"b", b"c"], timestamps_ms=TS)
    schema = pa.schema([f.with_type(pa.timestamp("us", tz="UTC")) if f.name == "timestamp" else f
                        for f in batch_body.BODY_SCHEMA])
    batch = pa.RecordBatch.from_arrays([c.cast(f.type) for c, f in zip(other.columns, schema)], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return _framed(sink.getvalue().to_pybytes())


SCHEMA_MESSAGE_BYTES = len(batch_body.BODY_SCHEMA.serialize())
POISON_BATCHES = [
    # id, batch bytes, expected error class, words the error message must contain
    ("record-count-far-above-body-rows", lambda: _framed(_ipc_of([b"a", b"b", b"c"]), record_count=1_000_000),
     CorruptMessageError, "record_count 1000000"),
    ("record-count-below-body-rows", lambda: _framed(_ipc_of([b"a", b"b", b"c"]), record_count=1),
     CorruptMessageError, "record_count 1"),
    ("foreign-schema", _foreign_schema_body, CorruptMessageError, "foreign body schema"),
    ("garbage-after-ipc-marker", lambda: _framed(b"\xff\xff\xff\xff" + random.Random(8).randbytes(700)),
     CorruptMessageError, "schema message"),
    ("schema-then-garbage",
     lambda: _framed(_ipc_of([b"a", b"b", b"c"])[:SCHEMA_MESSAGE_BYTES] + random.Random(9).randbytes(300)),
     CorruptMessageError, "record batch message"),
    ("record-batch-message-truncated", lambda: _framed(_ipc_of([b"a", b"b", b"c"])[:-24]),
     CorruptMessageError, "bodyLength"),
    ("garbage-after-record-batch", lambda: _framed(_ipc_of([b"a", b"b", b"c"]) + b"\x00" * 24),
     CorruptMessageError, "bodyLength"),
    ("negative-timestamp", lambda: _framed(_ipc_of([b"a", b"b", b"c"], ts=-1000), ts=-1000),
     InvalidTimestampError, "base_timestamp -1000 is negative"),
    ("last-offset-delta-above-count", lambda: _counts(3, 5)(make_batch([b"a", b"b", b"c"])),
     InvalidRecordError, "inconsistent batch offset range: last_offset_delta 5 != record_count 3 - 1"),
    # batches the format allows but no producer may write: only the leader compacts and marks transactions
    *[(name, make, InvalidRecordError, words) for name, make, words in FORGED_BATCHES],
]


def assert_appends_continue(client, topic: Seeded) -> None:
    """A valid batch after the refused one lands right behind the seeded records."""
    result = produce(client, topic.name, 0, make_batch([b"after-0", b"after-1"]))
    assert (result["error_code"], result["base_offset"]) == (NONE, len(SEED_VALUES)), result
    assert fetch_records(client, topic.name) == topic.records + [(3, b"after-0"), (4, b"after-1")]


@pytest.mark.parametrize("make, error, words", [c[1:] for c in POISON_BATCHES], ids=[c[0] for c in POISON_BATCHES])
def test_produce_of_a_poison_batch_is_refused_and_the_partition_keeps_working(server, raw_client, client, topic,
                                                                              make, error, words):
    """A CRC-valid batch whose body disagrees with its header or the record schema (or whose
    timestamp is negative) gets its named code naming the field; nothing is stored and the next
    valid append takes the next offset."""
    result = produce(client, topic.name, 0, make())
    assert result["error_code"] == error.code, result
    assert words in result["error_message"] and "batch at byte 0" in result["error_message"]
    assert result["base_offset"] == -1
    assert_serving(server, raw_client, same=client)
    topic.assert_untouched(client)
    assert_appends_continue(client, topic)


TIMESTAMP_BOUNDS = {"message.timestamp.before.max.ms": "3600000", "message.timestamp.after.max.ms": "60000"}
TIMESTAMP_CASES = [
    # id, offset from the broker's clock (ms), topic configs, expected error class (None: stored)
    ("far-past-beyond-before-max", -2 * 3_600_000, TIMESTAMP_BOUNDS, InvalidTimestampError),
    ("far-future-beyond-after-max", 10 * 60_000, TIMESTAMP_BOUNDS, InvalidTimestampError),
    ("far-future-default-hour", 2 * 3_600_000, {}, InvalidTimestampError),
    ("within-bounds", -30 * 60_000, TIMESTAMP_BOUNDS, None),
    ("far-future-log-append-time", 10 * 3_600_000, {**TIMESTAMP_BOUNDS, "message.timestamp.type": "LogAppendTime"}, None),
]


@pytest.mark.parametrize("delta_ms, configs, error", [c[1:] for c in TIMESTAMP_CASES], ids=[c[0] for c in TIMESTAMP_CASES])
def test_produce_outside_the_topics_timestamp_bounds_is_invalid_timestamp(server, raw_client, client, delta_ms, configs,
                                                                          error):
    """A CreateTime topic refuses a batch stamped further from the broker's clock than its
    message.timestamp.before/after.max.ms (INVALID_TIMESTAMP, nothing stored); LogAppendTime
    topics take the broker's time and skip the bounds."""
    name = f"ts-{next(_names)}"
    create_topic(client, name, configs=configs)
    before = stored_files(server.log_dir, name)
    result = produce(client, name, 0, make_batch([b"stamped"], ts=batch_body.now_ms() + delta_ms))
    if error is None:
        assert (result["error_code"], result["base_offset"]) == (NONE, 0), result
        assert fetch_records(client, name) == [(0, b"stamped")]
        return
    assert result["error_code"] == error.code, result
    assert "message.timestamp." in result["error_message"] and "batch at byte 0" in result["error_message"]
    assert_serving(server, raw_client, same=client)
    assert stored_files(server.log_dir, name) == before
    assert fetch_records(client, name) == []
    assert produce(client, name, 0, make_batch([b"now"], ts=batch_body.now_ms()))["base_offset"] == 0
    assert fetch_records(client, name) == [(0, b"now")]


@pytest.mark.parametrize("restart", ["sigkill", "clean-stop"])
def test_only_acknowledged_batches_survive_a_restart_after_poison(broker_factory, raw_client, restart):
    """Poison batches refused between acknowledged ones leave no trace: after a SIGKILL or a
    clean restart the partition holds exactly the acknowledged records at their offsets, and
    appends go on from there."""
    broker = broker_factory("poison-restart").start()
    acknowledged: list[tuple[int, bytes]] = []
    with raw_client(broker.port) as client:
        create_topic(client, "poison")
        for i, (_, make, error, _) in enumerate(POISON_BATCHES):
            result = produce(client, "poison", 0, make_batch([b"ack-%d" % i]))
            assert result["error_code"] == NONE, result
            acknowledged.append((result["base_offset"], b"ack-%d" % i))
            assert produce(client, "poison", 0, make())["error_code"] == error.code
        assert fetch_records(client, "poison") == acknowledged
    if restart == "sigkill":
        broker.kill()
    else:
        assert broker.stop() == 0
    broker.start()
    with raw_client(broker.port) as client:
        assert fetch_records(client, "poison") == acknowledged == [(i, b"ack-%d" % i) for i in range(len(POISON_BATCHES))]
        assert produce(client, "poison", 0, make_batch([b"next"]))["base_offset"] == len(POISON_BATCHES)


KEYS = 8


def keyed_value(offset: int) -> bytes:
    """The value keyed_batch gives the record it puts at `offset` (round offset // KEYS)."""
    return b"%d-%d-" % divmod(offset, KEYS) + b"v" * 150


def keyed_batch(round_: int) -> bytearray:
    """One update of each of KEYS keys, ~1.5 KiB (a few fill a 4 KiB segment), for offsets
    round_ * KEYS onwards."""
    values = [keyed_value(round_ * KEYS + k) for k in range(KEYS)]
    return record.encode_batch(batch_body.make_body(values, keys=[b"key-%d" % k for k in range(KEYS)], timestamps_ms=TS))


def assert_compacted_updates(records: list[tuple[int, bytes]], rounds: int) -> None:
    """Records of `rounds` keyed batches, as compaction may leave them whatever passes ran: each
    at its original offset, in order, with the last round whole (the latest value of every key)."""
    offsets = [offset for offset, _ in records]
    assert offsets == sorted(set(offsets)) and all(value == keyed_value(offset) for offset, value in records)
    assert offsets[-KEYS:] == list(range((rounds - 1) * KEYS, rounds * KEYS))


def wait_for_log(broker, words: str, timeout_s: float = 60.0) -> None:
    wait_until(lambda: words in broker.log_tail(200_000), timeout_s, f"the broker logs {words!r}")


def test_forged_offset_range_on_a_compacted_topic_is_refused_and_the_cleaner_keeps_working(broker_factory, raw_client):
    """A producer's compacted-layout batch claiming offsets [2^20, 2^20] is INVALID_RECORD and
    takes no offset: the updates after it start at 0, the log cleaner compacts the topic (it never
    marks it uncleanable), and after a restart the partition reads and appends as before."""
    broker = broker_factory("forged-compacted", **{"log.cleaner.backoff.ms": 20, "file.delete.delay.ms": 0}).start()
    name, rounds = "forged-compacted", 12
    with raw_client(broker.port) as client:
        create_topic(client, name, configs={"cleanup.policy": "compact", "segment.bytes": "4096",
                                            "min.cleanable.dirty.ratio": "0.01"})
        refused = produce(client, name, 0, compacted([1 << 20, 1 << 20]))
        assert (refused["error_code"], refused["base_offset"]) == (InvalidRecordError.code, -1), refused
        assert "inconsistent batch offset range" in refused["error_message"]
        offsets = [produce(client, name, 0, keyed_batch(r))["base_offset"] for r in range(rounds)]
        assert offsets == [KEYS * r for r in range(rounds)]
        wait_for_log(broker, f"cleaned {name}-0")
        cleaned = fetch_records(client, name)
        assert_compacted_updates(cleaned, rounds)
        assert len(cleaned) < KEYS * rounds
    assert broker.stop() == 0
    broker.start()
    with raw_client(broker.port) as client:
        assert_compacted_updates(fetch_records(client, name), rounds)
        assert produce(client, name, 0, keyed_batch(rounds))["base_offset"] == KEYS * rounds
        assert produce(client, name, 0, compacted([0, 3, 7]))["error_code"] == InvalidRecordError.code
        assert_compacted_updates(fetch_records(client, name), rounds + 1)
    assert "cannot clean" not in broker.log_tail(200_000)


def test_broker_log_has_no_tracebacks_after_all_this_bad_input(server):
    """Runs last in this module: no case above crashed a handler or the connection code."""
    blocks = server.output.read_text(errors="replace").split("Traceback (most recent call last):")[1:]
    assert not blocks, "broker logged tracebacks:\n" + "\n---\n".join(b[:2000] for b in blocks)
