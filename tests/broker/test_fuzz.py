"""A seeded wire fuzz against one real broker process: over ten thousand hostile frames, and
afterwards the broker is alive, answers Metadata, and a topic written before the storm is
byte-identical on disk and consumes to exactly the same records.

The storm mixes (1) random bytes, with and without a plausible size prefix, (2) well-framed
requests of random API keys whose control maps are random (shaped like real requests or not),
and (3) valid Produce / Fetch / ListOffsets / Metadata / CreateTopics requests mutated by bit
flips, byte insertions and deletions, truncation, field-type swaps and random header fields, and
(4) produces to the snapshot topic of well-formed batches that no producer may write (forged
compacted offset ranges, offset gaps, control and transactional bits): INVALID_RECORD.

Keeping the snapshot check exact: valid produces go to the separate topic `fuzz-sink`; produces
aimed at the snapshot topic carry a batch whose CRC is forced wrong, or a forged one. Because frames are sent
back to back on a stream, a mutated size can make the broker see frames we never built (a tail
of one frame glued to the head of the next). So every chunk is first fed to a mirror of the
broker's own `FrameDecoder` (same limit, same bytes): if the broker would decode from it any
request that could change the snapshot topic (an admin write naming it, or a produce naming it
whose payload holds anywhere a batch the broker would take from a producer), the chunk is not sent and that connection is
replaced. Everything else is sent, responses are drained and thrown away.

The seed is fixed and printed on failure; PYMQ_FUZZ_SEED=<n> replays another one.
"""
from __future__ import annotations

import hashlib
import math
import os
import random
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pyarrow as pa
import pytest

import protocol
from segment_format import batch_body, record
from client import Admin, Producer
from broker.config import TOPIC_CONFIGS
from common.errors import (
    NONE,
    CorruptMessageError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTimestampError,
    UnknownServerError,
    error_for_code,
    error_name,
)
from protocol import ApiKey
from tests.broker.forged_batches import FORGED_BATCHES

SEED = int(os.environ.get("PYMQ_FUZZ_SEED", "20260611"))
FRAMES = int(os.environ.get("PYMQ_FUZZ_FRAMES", "30000"))
CONNECTIONS = 4
SNAP, SINK = "fuzz-snapshot", "fuzz-sink"
SNAP_RECORDS = 2_000
MAX_REQUEST_BYTES = 1 << 20  # small, so random sizes often hit the oversize path
MAX_MESSAGE_BYTES = 512 << 10
SEND_TIMEOUT_S = 2.0
STORM_DEADLINE_S = 60.0  # a storm that cannot send its frames in time fails instead of hanging
INT64_MAX = 2**63 - 1
TS = 1_700_000_000_000  # fixed record timestamps keep the frames a pure function of the seed
STATE_CHANGING = {ApiKey.PRODUCE, ApiKey.DELETE_TOPICS, ApiKey.ALTER_CONFIGS, ApiKey.CREATE_PARTITIONS}


# -- snapshot of the topic that must survive ---------------------------------------------------


def stored_files(log_dir: Path, topic: str) -> dict[str, tuple[int, str]]:
    """(size, sha256) of every file in every partition dir of `topic`, by path under log_dir."""
    out = {}
    for directory in sorted(log_dir.iterdir()):
        match = re.fullmatch(r"(.+)-(\d+)", directory.name)
        if directory.is_dir() and match is not None and match.group(1) == topic:
            for path in sorted(p for p in directory.rglob("*") if p.is_file()):
                data = path.read_bytes()
                out[str(path.relative_to(log_dir))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows sorted by (partition, offset), for exact comparison."""
    return sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"]))


# -- random values -----------------------------------------------------------------------------

INTS = [0, 1, 2, 3, -1, -2, -3, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
        2**32, 2**53, INT64_MAX, -(2**63), 2**64 - 1]
FLOATS = [0.0, -0.0, 0.5, 1.0, math.nan, math.inf, -math.inf, 1e300, -1e-300]
FIELDS = ["topics", "name", "partitions", "partition", "size", "fetch_offset", "timestamp", "acks", "max_wait_ms",
          "min_bytes", "max_bytes", "num_partitions", "replication_factor", "configs", "set", "delete", "count",
          "validate_only"]
NAMES = [SNAP, SINK, "no-such-topic", "", ".", "..", "a/b", "x" * 250, "spaces here", "t\u00f6pic", "fz-0", "fz-1"]
API_KEYS = [int(k) for k in ApiKey]


class Fuzzer:
    """Deterministic frame generator: the same seed gives the same frames, whatever the broker answers."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.batches = [
            bytes(record.encode_batch(batch_body.make_body(
                [rng.randbytes(rng.randint(0, 200)) for _ in range(n)],
                keys=[b"k%d" % i for i in range(n)],
                timestamps_ms=TS - rng.randint(0, 10_000)), compression=compression))
            for n, compression in [(1, "none"), (3, "none"), (20, "lz4"), (50, "zstd"), (7, "none")]
        ]
        self.forged = [bytes(make()) for _, make, _ in FORGED_BATCHES]
        self.created = 0

    # leaves
    def any_value(self, depth: int = 0) -> Any:
        rng = self.rng
        kind = rng.randrange(12 if depth < 3 else 9)
        if kind == 0:
            return rng.choice(INTS) if rng.random() < 0.6 else rng.randint(-(2**63), 2**64 - 1)
        if kind == 1:
            return rng.randint(-5, 20)
        if kind == 2:
            return rng.choice(FLOATS)
        if kind == 3:
            return rng.choice(NAMES + FIELDS + list(TOPIC_CONFIGS))
        if kind == 4:
            return "".join(chr(rng.randint(32, 0x2FF)) for _ in range(rng.randint(0, 12)))
        if kind == 5:
            return rng.randbytes(rng.randint(0, 16))
        if kind == 6:
            return rng.choice([True, False, None])
        if kind == 7:
            return msgpack.ExtType(rng.randint(0, 127), rng.randbytes(rng.randint(0, 8)))
        if kind == 8:
            return msgpack.Timestamp(rng.randint(0, 2**34), rng.randint(0, 999_999_999))
        if kind in (9, 10):
            return [self.any_value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {self.any_key(): self.any_value(depth + 1) for _ in range(rng.randint(0, 4))}

    def any_key(self) -> Any:
        r = self.rng.random()
        if r < 0.7:
            return self.rng.choice(FIELDS)
        if r < 0.95:
            return self.rng.choice(NAMES + list(TOPIC_CONFIGS))
        return self.rng.choice([1, b"topics", 2.5])  # the broker only accepts str map keys

    def leaf(self, kind: str) -> Any:
        """A plausible value for a field of `kind` most of the time, anything otherwise."""
        rng = self.rng
        if rng.random() < 0.25:
            return self.any_value(1)
        return {
            "name": lambda: rng.choice(NAMES),
            "partition": lambda: rng.choice([0, 0, 1, 1, 2, -1, 7]),
            "offset": lambda: rng.choice([0, 0, 1, 100, 999, 1000, 1001, -1, 2**62]),
            "timestamp": lambda: rng.choice([-1, -2, -3, 0, TS, 2**62]),
            "wait": lambda: rng.choice([0, 0, 0, 1, 10]),
            "count": lambda: rng.randint(-1, 4),
            "config": lambda: {rng.choice(list(TOPIC_CONFIGS) + ["no.such"]): rng.choice(
                ["1", "1000", "abc", "-1", "delete", "shred", "LogAppendTime", "4096", "", 5])},
            "int": lambda: rng.choice(INTS),
        }[kind]()

    # controls
    def shaped_control(self, api_key: int, payload_len: int) -> dict[str, Any]:
        """A control map shaped like a request of `api_key`, with random leaves and random keys dropped."""
        rng, leaf = self.rng, self.leaf
        if api_key in (ApiKey.METADATA, ApiKey.DELETE_TOPICS, ApiKey.DESCRIBE_CONFIGS):
            control = {"topics": [leaf("name") for _ in range(rng.randint(0, 3))]}
        else:
            topics = []
            for _ in range(rng.randint(0, 3)):
                parts = []
                for _ in range(rng.randint(0, 3)):
                    size = payload_len if rng.random() < 0.5 else leaf("int")
                    parts.append({"partition": leaf("partition"), "size": size, "fetch_offset": leaf("offset"),
                                  "timestamp": leaf("timestamp"), "max_bytes": leaf("int")})
                topics.append({"name": leaf("name"), "partitions": parts, "num_partitions": leaf("count"),
                               "replication_factor": rng.choice([1, 1, 0, 3, -1]), "configs": leaf("config"),
                               "set": leaf("config"), "delete": [rng.choice(list(TOPIC_CONFIGS) + ["x"])],
                               "count": leaf("count")})
            control = {"topics": topics, "acks": rng.choice([1, 1, 0, -1, 2]), "max_wait_ms": leaf("wait"),
                       "min_bytes": leaf("int"), "max_bytes": leaf("int"), "validate_only": rng.random() < 0.5}
        return self.drop_keys(control)

    def drop_keys(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.drop_keys(v) for k, v in value.items() if self.rng.random() > 0.15}
        if isinstance(value, list):
            return [self.drop_keys(v) for v in value]
        return value

    def payload(self) -> bytes:
        r = self.rng.random()
        if r < 0.4:
            return b""
        if r < 0.6:
            return self.rng.randbytes(self.rng.randint(1, 300))
        if r < 0.9:
            return self.rng.choice(self.batches)
        return b"".join(self.rng.choices(self.batches, k=2))

    # frames
    def frame(self) -> tuple[str, bytes]:
        r = self.rng.random()
        if r < 0.15:
            return "random-bytes", self.random_bytes()
        if r < 0.5:
            return "random-control", self.random_control_frame()
        if r < 0.58:
            return "broken-crc-to-snapshot", self.broken_snapshot_produce()
        if r < 0.62:
            return "forged-to-snapshot", self.forged_snapshot_produce()
        return "mutated", self.mutated_frame()

    def random_bytes(self) -> bytes:
        rng = self.rng
        data = rng.randbytes(rng.choice([rng.randint(1, 32), rng.randint(1, 512), rng.randint(1, 8192)]))
        if rng.random() < 0.5:  # a plausible size, so that the header fields get decoded
            data = struct.pack(">i", len(data)) + data
        return data

    def random_control_frame(self) -> bytes:
        rng = self.rng
        api_key = rng.choice(API_KEYS) if rng.random() < 0.9 else rng.randint(-(2**15), 2**15 - 1)
        payload = self.payload() if api_key == ApiKey.PRODUCE or rng.random() < 0.2 else b""
        if rng.random() < 0.6:
            control: Any = self.shaped_control(api_key, len(payload))
        else:
            control = {self.any_key(): self.any_value(1) for _ in range(rng.randint(0, 6))}
        version = 0 if rng.random() < 0.9 else rng.choice([1, -1, 2**15 - 1])
        return pack_frame(api_key, version, rng.randint(0, 2**31 - 1), control, payload)

    def valid_request(self) -> tuple[int, dict[str, Any], bytes]:
        rng = self.rng
        kind = rng.randrange(6)
        if kind <= 1:
            batches = b"".join(rng.choices(self.batches, k=rng.randint(1, 2)))
            return ApiKey.PRODUCE, {"acks": rng.choice([1, -1, 0]), "topics": [
                {"name": SINK, "partitions": [{"partition": rng.randint(0, 1), "size": len(batches)}]}]}, batches
        if kind == 2:
            return ApiKey.FETCH, {"max_wait_ms": 0, "min_bytes": rng.choice([0, 1]), "max_bytes": rng.choice([1024, 1 << 20]),
                                  "topics": [{"name": rng.choice([SNAP, SINK]), "partitions": [
                                      {"partition": rng.randint(0, 1), "fetch_offset": rng.choice([0, 5, 500]),
                                       "max_bytes": rng.choice([1, 4096, 1 << 20])}]}]}, b""
        if kind == 3:
            return ApiKey.LIST_OFFSETS, {"topics": [{"name": rng.choice([SNAP, SINK]), "partitions": [
                {"partition": rng.randint(0, 1), "timestamp": rng.choice([-1, -2, 0, TS])}]}]}, b""
        if kind == 4:
            return ApiKey.METADATA, rng.choice([{}, {"topics": [SNAP, SINK, "no-such-topic"]}]), b""
        self.created += 1
        return ApiKey.CREATE_TOPICS, {"topics": [{"name": f"fz-{self.created}", "num_partitions": rng.randint(1, 2),
                                                  "replication_factor": 1, "configs": {"retention.ms": "60000"}}]}, b""

    def swap_a_field(self, control: Any) -> Any:
        """Replace one randomly chosen value in the nested control with a value of another type."""
        paths: list[tuple[Any, Any]] = []

        def walk(node: Any) -> None:
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, child in items:
                paths.append((node, key))
                walk(child)

        walk(control)
        if paths:
            node, key = self.rng.choice(paths)
            old = node[key]
            new = self.any_value(2)
            while type(new) is type(old):
                new = self.any_value(2)
            node[key] = new
        return control

    def mutated_frame(self) -> bytes:
        rng = self.rng
        api_key, control, payload = self.valid_request()
        swapped = rng.random() < 0.4
        if swapped:
            control = self.swap_a_field(control)
        frame = pack_frame(api_key, 0, rng.randint(0, 2**31 - 1), control, payload)
        for _ in range(rng.randint(0 if swapped else 1, 3)):
            frame = self.mutate_bytes(frame)
        return frame

    def mutate_bytes(self, data: bytes) -> bytes:
        rng = self.rng
        buf = bytearray(data)
        op = rng.randrange(8)
        if op == 0 and buf:  # bit flip
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insertion
            i = rng.randint(0, len(buf))
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 2 and buf:  # deletion
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randint(1, 8)]
        elif op == 3 and len(buf) > 1:  # truncation
            del buf[rng.randrange(1, len(buf)) :]
        elif op == 4 and len(buf) >= 4:  # random frame size
            size = rng.choice([len(buf) - 4 + rng.randint(-8, 8), rng.choice(INTS), rng.randint(0, 2 * MAX_REQUEST_BYTES)])
            buf[0:4] = struct.pack(">i", max(-(2**31), min(size, 2**31 - 1)))
        elif op == 5 and len(buf) >= 16:  # random control_length
            buf[12:16] = struct.pack(">i", rng.choice([0, -1, 1, 2**31 - 1, rng.randint(0, len(buf))]))
        elif op == 6 and len(buf) >= 8:  # random api key and version
            buf[4:8] = struct.pack(">hh", rng.choice(API_KEYS + [-1, 999]), rng.choice([0, 0, 1, -1]))
        elif len(buf) > 16:  # overwrite a byte inside control or payload
            buf[rng.randrange(16, len(buf))] = rng.randrange(256)
        return bytes(buf)

    def broken_snapshot_produce(self) -> bytes:
        """A produce aimed at the snapshot topic whose (mutated) batch has a CRC that cannot match."""
        rng = self.rng
        batch = bytearray(rng.choice(self.batches))
        for _ in range(rng.randint(0, 2)):
            batch = bytearray(self.mutate_bytes(bytes(batch)))
        if len(batch) >= record.HEADER_SIZE:
            end = record.LENGTH_PREFIX + struct.unpack_from("<i", batch, 8)[0]
            covered = batch[record.CRC_START : end] if record.CRC_START <= end <= len(batch) else batch[record.CRC_START :]
            wrong = crc32c.crc32c(bytes(covered)) ^ (1 << rng.randrange(32))
            struct.pack_into("<I", batch, 17, wrong)
        control = {"acks": rng.choice([1, 0, -1]), "topics": [
            {"name": SNAP, "partitions": [{"partition": rng.randint(0, 1), "size": len(batch)}]}]}
        return pack_frame(ApiKey.PRODUCE, 0, rng.randint(0, 2**31 - 1), control, bytes(batch))


    def forged_snapshot_produce(self) -> bytes:
        """A produce aimed at the snapshot topic of a well-formed batch (CRC and all) that no
        producer may write, sometimes two of them: the broker must refuse it (INVALID_RECORD)."""
        rng = self.rng
        batches = b"".join(rng.choices(self.forged, k=rng.randint(1, 2)))
        control = {"acks": rng.choice([1, -1]), "topics": [
            {"name": SNAP, "partitions": [{"partition": rng.randint(0, 1), "size": len(batches)}]}]}
        return pack_frame(ApiKey.PRODUCE, 0, rng.randint(0, 2**31 - 1), control, batches)


def pack_frame(api_key: int, version: int, correlation_id: int, control: Any, payload: bytes) -> bytes:
    packed = msgpack.packb(control, use_bin_type=True)
    header = struct.pack(">ihhii", 12 + len(packed) + len(payload), api_key, version, correlation_id, len(packed))
    return header + packed + payload


# -- the safety mirror -------------------------------------------------------------------------


def names_snapshot(value: Any) -> bool:
    if isinstance(value, str):
        return value == SNAP
    if isinstance(value, dict):
        return any(names_snapshot(k) or names_snapshot(v) for k, v in value.items())
    if isinstance(value, list):
        return any(names_snapshot(v) for v in value)
    return False


def holds_a_valid_batch(payload: memoryview) -> bool:
    """True if a batch starting at any byte of `payload` passes the broker's validation of a
    producer's batch (without the timestamp bounds, which could only refuse more)."""
    magic = record.MAGIC
    producer = record.ProducerInput(batch_body.now_ms(), None)
    for pos in range(0, len(payload) - record.HEADER_SIZE + 1):
        if payload[pos + 16] != magic:
            continue
        try:
            record.validate_batch(payload, pos, producer=producer)
        except (CorruptMessageError, InvalidRecordError, InvalidTimestampError):
            continue
        return True
    return False


def could_change_snapshot(frame: protocol.Frame) -> bool:
    if not isinstance(frame, protocol.Request) or frame.api_key not in STATE_CHANGING:
        return False
    if not names_snapshot(frame.control):
        return False
    return frame.api_key != ApiKey.PRODUCE or holds_a_valid_batch(frame.payload)


def is_wire_code(code: int) -> bool:
    """A named broker error code: in the taxonomy and not a client-only (>= 1000) code."""
    return code == NONE or (code < 1000 and error_for_code(code).code == code)


def error_codes(control: Any) -> list[int]:
    """Every `error_code` in a response's control map, at any depth."""
    if isinstance(control, dict):
        own = [control["error_code"]] if isinstance(control.get("error_code"), int) else []
        return own + [c for v in control.values() for c in error_codes(v)]
    if isinstance(control, list):
        return [c for v in control for c in error_codes(v)]
    return []


# -- connections -------------------------------------------------------------------------------


@dataclass
class Stats:
    sent: dict[str, int] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    responses: int = 0
    codes: dict[str, int] = field(default_factory=dict)  # every error_code in responses, by name
    withheld: int = 0  # chunks not sent because the broker would have decoded a snapshot-changing request
    closed_by_framing: int = 0  # connections the broker was expected to close (bad frame size)
    closed_unexpectedly: int = 0
    send_timeouts: int = 0
    slow_closes: int = 0
    rotations: int = 0

    @property
    def frames(self) -> int:
        return sum(self.sent.values())


class FuzzConnection:
    """One socket plus a mirror of the broker's decoder fed exactly the bytes sent on it."""

    def __init__(self, port: int, budget: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SEND_TIMEOUT_S)
        self.mirror = protocol.FrameDecoder(MAX_REQUEST_BYTES)
        self.budget = budget  # frames before this connection is replaced (bounds long polls in flight)
        self.doomed = False  # the mirror says the broker will close it
        self.desynced = False  # a partial or skipped frame will swallow what comes next
        self.responses = protocol.ResponseDecoder(1 << 30)

    def received(self, chunk: bytes, stats: Stats) -> None:
        """Count responses and the error codes they carry (then drop them: memory stays bounded)."""
        stats.bytes_received += len(chunk)
        for response in self.responses.feed(chunk):
            stats.responses += 1
            for code in error_codes(response.control):
                name = error_name(code) if is_wire_code(code) else f"code {code}"
                stats.codes[name] = stats.codes.get(name, 0) + 1

    def check(self, chunk: bytes) -> bool:
        """Feed the mirror; False if the broker would decode a snapshot-changing request."""
        oversize = False
        try:
            for frame in self.mirror.feed(chunk):
                if could_change_snapshot(frame):
                    return False
                oversize = oversize or isinstance(frame, protocol.OversizeRequest)
        except InvalidRequestError:
            self.doomed = True
        self.desynced = oversize or self.mirror.buffered_bytes > 0
        return True

    def drain(self, stats: Stats) -> bool:
        """Read and discard whatever arrived; False once the broker has closed the connection."""
        self.sock.setblocking(False)
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return False
                self.received(chunk, stats)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            self.sock.settimeout(SEND_TIMEOUT_S)

    def retire(self, stats: Stats) -> None:
        """Close gracefully: half-close, so the broker reads and handles every byte sent, then
        closes on EOF; read (and discard) until it has. A plain close with unread responses would
        reset the connection and drop requests the broker had not read yet."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(5.0)
            while chunk := self.sock.recv(1 << 16):
                self.received(chunk, stats)
        except TimeoutError:
            stats.slow_closes += 1
        except OSError:
            pass
        self.sock.close()


def run_storm(port: int, rng: random.Random, frames: int) -> Stats:
    fuzzer, stats = Fuzzer(rng), Stats()
    budget = lambda: rng.randint(20, 400)  # noqa: E731
    conns = [FuzzConnection(port, budget()) for _ in range(CONNECTIONS)]
    deadline = time.monotonic() + STORM_DEADLINE_S
    while stats.frames < frames and time.monotonic() < deadline:
        kind, chunk = fuzzer.frame()
        i = rng.randrange(CONNECTIONS)
        conn = conns[i]
        if not conn.check(chunk):
            stats.withheld += 1
            replace = True
        else:
            replace = False
            if conn.desynced:  # usually start afresh; sometimes let a few frames pile into the desync
                replace = rng.random() < 0.8
                conn.budget = min(conn.budget, rng.randint(1, 4))
            try:
                conn.sock.sendall(chunk)
                stats.sent[kind] = stats.sent.get(kind, 0) + 1
                stats.bytes_sent += len(chunk)
                alive = conn.drain(stats)
            except TimeoutError:
                stats.send_timeouts += 1
                alive = True
                replace = True
            except OSError:
                alive = False
            conn.budget -= 1
            if conn.doomed:
                stats.closed_by_framing += 1
                replace = True
            elif not alive:
                stats.closed_unexpectedly += 1
                replace = True
            elif conn.budget <= 0:
                stats.rotations += 1
                replace = True
        if replace:
            conn.retire(stats)
            conns[i] = FuzzConnection(port, budget())
    for conn in conns:
        conn.retire(stats)
    return stats


# -- the storm, once per module ----------------------------------------------------------------


@dataclass
class Storm:
    broker: Any
    files_before: dict[str, tuple[int, str]]
    records_before: list[dict[str, Any]]
    configs_before: dict[str, Any]
    stats: Stats
    seconds: float


@pytest.fixture(scope="module")
def storm(module_broker_factory, consume_all) -> Storm:
    print(f"fuzz seed {SEED} (replay with PYMQ_FUZZ_SEED={SEED})")
    broker = module_broker_factory(
        "fuzz",
        **{
            "socket.request.max.bytes": MAX_REQUEST_BYTES,
            "message.max.bytes": MAX_MESSAGE_BYTES,
            "log.flush.interval.ms": INT64_MAX,  # the snapshot's files change only if something is appended
        },
    ).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(SNAP, partitions=2)
        admin.create_topic(SINK, partitions=2)
        configs_before = admin.describe_configs([SNAP])
    with Producer(broker.bootstrap, linger_ms=5, batch_size=16 * 1024) as producer:
        futures = [producer.send(SNAP, b"value-%d-" % i + bytes(i % 97), key=b"key-%d" % i) for i in range(SNAP_RECORDS)]
        producer.flush()
    assert all(f.result().offset >= 0 for f in futures)
    records_before = sorted_rows(consume_all(broker.bootstrap, SNAP, 2, SNAP_RECORDS))
    assert sorted(r["value"] for r in records_before) == sorted(b"value-%d-" % i + bytes(i % 97) for i in range(SNAP_RECORDS))
    files_before = stored_files(broker.log_dir, SNAP)
    started = time.monotonic()
    stats = run_storm(broker.port, random.Random(SEED), FRAMES)
    seconds = time.monotonic() - started
    print(f"fuzz seed {SEED}: {stats} in {seconds:.1f}s")
    return Storm(broker, files_before, records_before, configs_before, stats, seconds)


def broker_tracebacks(broker: Any) -> list[str]:
    text = broker.output.read_text(errors="replace")
    return ["Traceback" + block[:3000] for block in text.split("Traceback")[1:]]


@pytest.mark.slow
def test_fuzz_storm_leaves_broker_serving_and_snapshot_topic_byte_identical(storm, raw_client, consume_all):
    """After >10,000 hostile frames the broker is alive, answers Metadata, and the snapshot topic's
    files, partition count, configs and consumed records are exactly as before."""
    seed, stats, broker = f"seed {SEED}", storm.stats, storm.broker
    assert stats.frames >= 10_000, (seed, stats)
    assert broker.proc is not None and broker.proc.poll() is None, f"{seed}: broker died"
    reply, _ = raw_client(broker.port).request(ApiKey.METADATA, {"topics": [SNAP]})
    assert reply["error_code"] == NONE and len(reply["topics"][0]["partitions"]) == 2, (seed, reply)
    assert stored_files(broker.log_dir, SNAP) == storm.files_before, f"{seed}: snapshot files changed"
    with Admin(broker.bootstrap) as admin:
        assert admin.describe_configs([SNAP]) == storm.configs_before, seed
    assert sorted_rows(consume_all(broker.bootstrap, SNAP, 2, SNAP_RECORDS)) == storm.records_before, seed


def test_fuzz_storm_closes_connections_only_for_unframeable_sizes(storm):
    """The broker closed no connection except those whose bytes announced an impossible frame size."""
    assert storm.stats.closed_unexpectedly == 0, (f"seed {SEED}", storm.stats)


def test_fuzz_storm_logs_no_tracebacks(storm):
    """No request crashed a handler or the connection code."""
    tracebacks = broker_tracebacks(storm.broker)
    assert not tracebacks, f"seed {SEED}: {len(tracebacks)} tracebacks in {storm.broker.output}:\n" + "\n".join(tracebacks[:5])


def test_fuzz_storm_answers_only_named_error_codes(storm):
    """Every error code the broker sent is a named wire code: no UNKNOWN_SERVER_ERROR (a crash) and
    no internal code leaking out."""
    unexpected = {name: n for name, n in storm.stats.codes.items()
                  if name == UnknownServerError.name() or name.startswith("code ")}
    assert not unexpected, (f"seed {SEED}", unexpected)


def test_fuzz_storm_refuses_forged_batches_as_invalid_record(storm):
    """Produces of batches no producer may write reached the broker and were answered
    INVALID_RECORD (the snapshot test above proves they changed nothing)."""
    stats = storm.stats
    assert stats.sent.get("forged-to-snapshot", 0) > 0, (f"seed {SEED}", stats)
    assert stats.codes.get(InvalidRecordError.name(), 0) > 0, (f"seed {SEED}", stats)
