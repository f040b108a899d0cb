"""Bytes on disk per record: pymq's record batch (61-byte header + Arrow IPC body) next to Kafka's v2.

The broker appends a produced batch to the segment byte for byte (docs/architecture.md, Record batch), so a
batch's encoded size is what it costs on disk; the sparse offset and time indexes add about
12 bytes per `index.interval.bytes` (4 KiB) on top, under 0.3 %, and are left out.

Batches of 1, 10, 100 and 1,000 records of 100-byte values (random uppercase letters, as
`kafka-producer-perf-test` and the other benchmarks here use), no headers, null keys or 16-byte
random keys, compression none / lz4 / zstd. Kafka's v2 batch, for comparison: a 61-byte header
plus per record ~10 bytes of varints and attributes, the key and the value (uncompressed).

    python -m benchmarks.batch_overhead [--output batch_overhead]

Prints a markdown table (bytes per record) and writes `benchmarks/results/<output>.json`.
"""
from __future__ import annotations

import argparse
from typing import Any

from benchmarks import harness

VALUE_BYTES = 100
KEY_BYTES = 16
BATCH_RECORDS = (1, 10, 100, 1000)
COMPRESSIONS = ("none", "lz4", "zstd")
KAFKA_HEADER_BYTES = 61
KAFKA_RECORD_OVERHEAD_BYTES = 10
TIMESTAMP_MS = 1_700_000_000_000


def kafka_v2_bytes(records: int, key_bytes: int) -> int:
    """Size of Kafka's uncompressed v2 batch of `records` records (header + ~10 B/record + data)."""
    return KAFKA_HEADER_BYTES + records * (KAFKA_RECORD_OVERHEAD_BYTES + key_bytes + VALUE_BYTES)


def pymq_bytes(records: int, key_bytes: int, compression: str) -> int:
    """Size of pymq's encoded batch (what the broker writes) of `records` such records."""
    import numpy as np
    import pyarrow as pa

    from segment_format import batch_body, record

    values = harness.value_table(harness.payload_buffer(VALUE_BYTES, records), VALUE_BYTES, records).column("value")
    keys = None
    if key_bytes:
        raw = np.random.default_rng(11).integers(0, 256, records * key_bytes, dtype=np.uint8)
        offsets = np.arange(records + 1, dtype=np.int32) * key_bytes
        keys = pa.Array.from_buffers(pa.binary(), records, [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
    body = batch_body.make_body(values.combine_chunks(), keys=keys, timestamps_ms=TIMESTAMP_MS)
    return len(record.encode_batch(body, compression=compression))


def measure() -> list[dict[str, Any]]:
    rows = []
    for key_bytes in (0, KEY_BYTES):
        for records in BATCH_RECORDS:
            row: dict[str, Any] = {"keys": f"{key_bytes} B" if key_bytes else "null", "records": records}
            for compression in COMPRESSIONS:
                row[compression] = pymq_bytes(records, key_bytes, compression) / records
            row["kafka_v2"] = kafka_v2_bytes(records, key_bytes) / records
            row["none_vs_kafka"] = row["none"] / row["kafka_v2"]
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| keys | records/batch | pymq none | pymq lz4 | pymq zstd | Kafka v2 (uncompressed) | pymq none / Kafka |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        out.append(f"| {row['keys']} | {row['records']:,} | {row['none']:,.1f} | {row['lz4']:,.1f} | "
                   f"{row['zstd']:,.1f} | {row['kafka_v2']:,.1f} | {row['none_vs_kafka']:.2f}x |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="batch_overhead", help="results/<output>.json")
    args = parser.parse_args()
    rows = measure()
    print(f"Bytes on disk per record, {VALUE_BYTES}-byte values, no headers\n")
    print(markdown(rows))
    print(f"\nwrote {harness.write_results(args.output, {'rows': rows})}")


if __name__ == "__main__":
    main()
