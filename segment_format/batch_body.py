"""The Arrow body of a record batch: its schema, building one from columns, and writing it as an
Arrow IPC stream (docs/architecture.md, Record batch).

Body schema, in this order: key binary, value binary, timestamp timestamp[ms, UTC] not null,
headers list<struct<key string, value binary>>; only in batches rewritten by compaction, a last
column offset_delta int32 not null. `BodyLayout` is what the validator (record.py) knows of each
of the two schemas without decoding a body.

Two modules build on this one, which imports neither: `record`, which frames bodies behind the
61-byte header and validates them, and `body_template`, which writes small bodies without pyarrow.
Pure: no I/O.
"""
from __future__ import annotations

import functools
import time
from typing import Literal, NamedTuple

import numpy as np
import pyarrow as pa

from segment_format import arrow_ipc

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
BODY_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("headers", HEADERS_TYPE),
    ]
)
OFFSET_DELTA_FIELD = pa.field("offset_delta", pa.int32(), nullable=False)
COMPACTED_BODY_SCHEMA = BODY_SCHEMA.append(OFFSET_DELTA_FIELD)

Compression = Literal["none", "lz4", "zstd"]
COMPRESSIONS: tuple[str, ...] = ("none", "lz4", "zstd")
_WRITE_OPTIONS = {
    "none": pa.ipc.IpcWriteOptions(),
    "lz4": pa.ipc.IpcWriteOptions(compression="lz4"),
    "zstd": pa.ipc.IpcWriteOptions(compression="zstd"),
}


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch: the unit of every record timestamp."""
    return time.time_ns() // 1_000_000


@functools.cache
def warm_up() -> None:
    """Load Arrow's time-zone database now: the first cast to timestamp[ms, UTC] costs ~200 ms,
    which clients would otherwise add to their first record's latency."""
    pa.array([0], pa.int64()).cast(TIMESTAMP_TYPE)


def null_headers(n: int) -> pa.ListArray:
    """A headers column of `n` nulls with an empty child array.

    `pa.nulls(n, HEADERS_TYPE)` gives its child struct n hidden elements, which Arrow IPC then
    writes out in full (about 12 bytes per record of nothing). Served as a zero-copy slice of a
    shared column (IPC writes only the slice), since nearly every batch needs one.
    """
    global _shared_null_headers
    shared = _shared_null_headers
    if shared is None or len(shared) < n:
        if n > _NULL_HEADERS_SHARED_MAX:
            return _build_null_headers(n)
        shared = _shared_null_headers = _build_null_headers(max(n, 1024, 2 * len(shared or ())))
    return shared.slice(0, n)


def _build_null_headers(n: int) -> pa.ListArray:
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)),
        pa.array([], HEADERS_TYPE.value_type),
        type=HEADERS_TYPE,
        mask=pa.array(np.ones(n, dtype=bool)),
    )


_NULL_HEADERS_SHARED_MAX = 1 << 20
_shared_null_headers: pa.ListArray | None = None  # built on first use: the broker never needs one


def make_body(
    values: pa.Array | list,
    keys: pa.Array | list | None = None,
    timestamps_ms: pa.Array | list | int | None = None,
    headers: pa.Array | list | None = None,
    offset_deltas: pa.Array | list | None = None,
) -> pa.RecordBatch:
    """Build a body RecordBatch from columns (Arrow arrays or Python lists): the standard schema,
    or with `offset_deltas` (strictly increasing, from 0) the compacted one.

    `timestamps_ms` may be one int for every record; None means all null keys / headers.
    """
    values = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    n = len(values)
    if keys is None:
        keys = pa.nulls(n, pa.binary())
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.binary())
    if timestamps_ms is None or isinstance(timestamps_ms, int):
        ts = now_ms() if timestamps_ms is None else timestamps_ms
        timestamps = pa.array(np.full(n, ts, dtype=np.int64))
    elif isinstance(timestamps_ms, pa.Array):
        timestamps = timestamps_ms
    else:
        timestamps = pa.array(timestamps_ms, TIMESTAMP_TYPE)
    if timestamps.type != TIMESTAMP_TYPE:
        timestamps = timestamps.cast(TIMESTAMP_TYPE)
    if headers is None:
        headers = null_headers(n)
    elif not isinstance(headers, pa.Array):
        headers = pa.array(headers, HEADERS_TYPE)
    if offset_deltas is None:
        return pa.RecordBatch.from_arrays([keys, values, timestamps, headers], schema=BODY_SCHEMA)
    if not isinstance(offset_deltas, pa.Array):
        offset_deltas = pa.array(offset_deltas, pa.int32())
    return pa.RecordBatch.from_arrays([keys, values, timestamps, headers, offset_deltas], schema=COMPACTED_BODY_SCHEMA)


_SMALL_BODY_BYTES = 64 << 10


def encode_body(body: pa.RecordBatch, compression: str = "none") -> pa.Buffer:
    """Serialize `body` as an Arrow IPC stream: the schema message and one record batch message.

    Two things save bytes without losing information: the 8-byte end-of-stream marker is left
    out (the batch header frames the body; Arrow readers take the end of the data as the end of
    the stream), and a batch that compression would make larger (small batches: every buffer
    gets a frame header and an 8-byte length) is written uncompressed instead.
    Raises ValueError for an unknown compression or a schema other than the two body schemas.
    """
    try:
        options = _WRITE_OPTIONS[compression]
    except KeyError:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}") from None
    layout = next((layout for layout in (STANDARD_LAYOUT, COMPACTED_LAYOUT) if body.schema.equals(layout.schema)), None)
    if layout is None:
        raise ValueError(f"a body must have the record schema (or the compacted one), not {body.schema}")
    if compression == "none" and body.get_total_buffer_size() <= _SMALL_BODY_BYTES:  # (nbytes costs 7 us)
        # The schema message is constant: a small body needs only its record batch message
        # written, which `serialize` does without a stream writer (half the fixed cost of a
        # one-record batch; the extra copy of joining the two grows with size, hence the bound).
        return pa.py_buffer(layout.schema_message + body.serialize())
    encoded = _write_stream(layout.schema, body, options)
    # get_record_batch_size is the size of the uncompressed record batch message, known without writing it.
    if compression != "none" and len(encoded) >= len(layout.schema_message) + pa.ipc.get_record_batch_size(body):
        encoded = _write_stream(layout.schema, body, _WRITE_OPTIONS["none"])
    return encoded


def _write_stream(schema: pa.Schema, body: pa.RecordBatch, options: pa.ipc.IpcWriteOptions) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        writer.write_batch(body)
    stream = sink.getvalue()
    assert stream[-len(arrow_ipc.END_OF_STREAM):] == arrow_ipc.END_OF_STREAM
    return stream.slice(0, len(stream) - len(arrow_ipc.END_OF_STREAM))


class BodyLayout(NamedTuple):
    """What the validator knows of an accepted body schema without decoding a body: how many
    field nodes and buffers its record batch message has (Arrow's columnar layout, one node per
    field in pre-order), and the node index, name and nullability of each top-level column."""

    schema: pa.Schema
    schema_message: bytes  # pyarrow's encoding of the schema message, as pymq writes it
    compacted: bool
    nodes: int
    buffers: int
    columns: tuple[tuple[int, str, bool], ...]


def _node_and_buffer_counts(kind: pa.DataType) -> tuple[int, int]:
    """Field nodes and buffers one column of `kind` has in an IPC record batch: validity, offsets
    and data for binary and string; validity and values for fixed width; validity and offsets for
    a list; validity for a struct; plus its children's."""
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        own = 3
    elif pa.types.is_timestamp(kind) or pa.types.is_int32(kind) or pa.types.is_list(kind):
        own = 2
    else:
        assert pa.types.is_struct(kind), f"no IPC layout known for {kind}"
        own = 1
    nodes, buffers = 1, own
    for i in range(kind.num_fields):
        child_nodes, child_buffers = _node_and_buffer_counts(kind.field(i).type)
        nodes, buffers = nodes + child_nodes, buffers + child_buffers
    return nodes, buffers


def _body_layout(schema: pa.Schema, compacted: bool) -> BodyLayout:
    nodes = buffers = 0
    columns = []
    for field in schema:
        columns.append((nodes, field.name, field.nullable))
        field_nodes, field_buffers = _node_and_buffer_counts(field.type)
        nodes, buffers = nodes + field_nodes, buffers + field_buffers
    return BodyLayout(schema, schema.serialize().to_pybytes(), compacted, nodes, buffers, tuple(columns))


STANDARD_LAYOUT = _body_layout(BODY_SCHEMA, compacted=False)
COMPACTED_LAYOUT = _body_layout(COMPACTED_BODY_SCHEMA, compacted=True)
assert (STANDARD_LAYOUT.nodes, STANDARD_LAYOUT.buffers, COMPACTED_LAYOUT.nodes, COMPACTED_LAYOUT.buffers) == (7, 17, 8, 19)
