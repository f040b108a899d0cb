"""The aborted transaction index `{base_offset:020d}.txnindex` (Kafka's TxnIndex): one per segment
that holds an ABORT marker, listing the transactions those markers aborted, so a read_committed
reader knows which batches to drop without reading the markers first.

A 16-byte header (the sparse index files' layout, index_file.py) followed by fixed-size entries,
little-endian, in the order the markers were written (last_offset strictly increasing):

    offset size field
    0      4    magic b"PMQX"
    4      2    version (uint16) = 1
    6      2    entry_size (uint16) = 32
    8      8    base_offset (int64)          the segment's base offset, as in the file name
    16     ...  entries:
                0   8  producer_id (int64)
                8   8  first_offset (int64)        the aborted transaction's first batch
                16  8  last_offset (int64)         its ABORT marker (in this segment)
                24  8  last_stable_offset (int64)  the partition's LSO once the marker was written

Uploaded with tiered segments as `{base_offset:020d}-{upload_id}.txnindex` (when the segment has
one): Spark executors that read the tier directly parse it here (`parse`) and drop the batches
`collect_aborted` names. Pure: bytes in, values out.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from segment_format.index_file import CorruptIndexError

MAGIC = b"PMQX"
VERSION = 1
HEADER = struct.Struct("<4sHHq")
ENTRY = struct.Struct("<qqqq")
HEADER_SIZE = HEADER.size
ENTRY_SIZE = ENTRY.size


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_header(base_offset: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ENTRY_SIZE, base_offset)


def encode_entry(txn: AbortedTxn) -> bytes:
    return ENTRY.pack(*txn)


def encode(base_offset: int, entries: Iterable[AbortedTxn]) -> bytes:
    return encode_header(base_offset) + b"".join(ENTRY.pack(*txn) for txn in entries)


def parse(data: bytes | bytearray | memoryview, where: str, base_offset: int) -> list[AbortedTxn]:
    """The entries of a `.txnindex` file's bytes. CorruptIndexError if the header is not this
    kind's for `base_offset`, the length is not whole entries, or entries do not grow."""
    if len(data) < HEADER_SIZE:
        raise CorruptIndexError(f"{where}: {len(data)} bytes, too short for a transaction index header")
    magic, version, entry_size, base = HEADER.unpack_from(data)
    if (magic, version, entry_size, base) != (MAGIC, VERSION, ENTRY_SIZE, base_offset):
        raise CorruptIndexError(f"{where}: header {magic!r} v{version} size {entry_size} base {base} is not a "
                                f"version {VERSION} transaction index of segment {base_offset}")
    if (len(data) - HEADER_SIZE) % ENTRY_SIZE:
        raise CorruptIndexError(f"{where}: {len(data) - HEADER_SIZE} bytes of entries, not a multiple of {ENTRY_SIZE}")
    entries = [AbortedTxn(*fields) for fields in ENTRY.iter_unpack(memoryview(data)[HEADER_SIZE:])]
    previous = base_offset - 1
    for txn in entries:
        if not txn.first_offset <= txn.last_offset or txn.last_offset <= previous:
            raise CorruptIndexError(f"{where}: entry {txn} does not follow offset {previous}")
        previous = txn.last_offset
    return entries


def collect_aborted(entries: Iterable[AbortedTxn], start_offset: int, upper_bound: int) -> list[tuple[int, int]]:
    """(producer_id, first_offset) of every entry overlapping [start_offset, upper_bound):
    last_offset >= start_offset and first_offset < upper_bound (Kafka's collectAbortedTxns)."""
    return [(txn.producer_id, txn.first_offset) for txn in entries
            if txn.last_offset >= start_offset and txn.first_offset < upper_bound]
