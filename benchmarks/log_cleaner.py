"""Log cleaner throughput: one compacted partition log cleaned in the harness process.

The cleaner runs on its own thread inside the broker and never touches the network, so this
measures it without a broker: a LogManager in a temporary directory, one partition with
`cleanup.policy=compact`, `--records` records (default 1M) of 100-byte values over `--keys`
distinct 16-byte keys (default 10k, uniformly random), appended in batches of `--batch-records`
(1,000) through `append_as_leader` (the produce path) into `--segment-mb` (16 MiB) segments, then
flushed (the cleaner stays below the recovery point; it never cleans the active segment, the last
~8 MiB here). Then, timed:

- `first round`: `LogCleaner.clean_once` over the wholly dirty log (the offset map of every key,
  then every sealed segment compacted and swapped in);
- `second round`: two segments' worth of updates appended (289k records at the defaults), and the
  next round, which maps the new dirty section and re-copies the clean section (what every later
  round costs).

MB/s is the bytes of the segments cleaned (the cleaning pass's reads, Kafka's "MB of log
processed") over the round's wall time, both passes included; records/s likewise. The map pass and
the cleaning pass are also timed apart.

    python -m benchmarks.log_cleaner [--records N] [--keys N] [--compression none lz4 zstd] [--quick]

Prints a table and writes `benchmarks/results/log_cleaner.json`.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

from benchmarks import harness
from benchmarks.harness import MB, SummaryRow

VALUE_BYTES = 100
KEY_BYTES = 16
TIMESTAMP_MS = 1_700_000_000_000


def build_log(directory: Any, records: int, keys: int, batch_records: int, segment_bytes: int,
              compression: str) -> tuple[Any, Any]:
    """A LogManager with one compacted log holding `records` updates of `keys` keys."""
    from broker.config import LogConfig
    from broker.log import LogManager, TopicLogSpec

    config = LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact", retention_ms=-1,
                       min_cleanable_dirty_ratio=0.0, message_timestamp_before_max_ms=2**63 - 1)
    manager = LogManager(directory, clock=lambda: TIMESTAMP_MS)
    partition_log = manager.load({"compacted": TopicLogSpec(None, config, 1)})[("compacted", 0)]
    append_updates(partition_log, records, keys, batch_records, compression, seed=1)
    return manager, partition_log


def append_updates(partition_log: Any, records: int, keys: int, batch_records: int, compression: str, seed: int) -> None:
    """Append `records` updates of uniformly random keys among `keys`, then make them cleanable."""
    import numpy as np
    import pyarrow as pa

    from segment_format import batch_body, record

    rng = np.random.default_rng(seed)
    key_bytes = np.frombuffer(b"".join(b"key-%012d" % i for i in range(keys)), dtype=np.uint8)
    values = harness.value_table(harness.payload_buffer(VALUE_BYTES, batch_records), VALUE_BYTES, batch_records)
    for start in range(0, records, batch_records):
        n = min(batch_records, records - start)
        chosen = rng.integers(0, keys, n)
        raw = key_bytes.reshape(keys, KEY_BYTES)[chosen].reshape(-1)
        offsets = np.arange(n + 1, dtype=np.int32) * KEY_BYTES
        key_array = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw)])
        body = batch_body.make_body(values.column("value").combine_chunks()[:n], keys=key_array, timestamps_ms=TIMESTAMP_MS)
        partition_log.append_as_leader(record.encode_batch(body, compression=compression), 0)
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    partition_log.flush()


def timed_round(cleaner: Any, partition_log: Any) -> dict[str, Any]:
    import time

    size_before = partition_log.size_bytes()
    started = time.perf_counter()
    stats = cleaner.clean_once(TIMESTAMP_MS)
    seconds = time.perf_counter() - started
    if stats is None:
        raise RuntimeError("the log was not cleaned (no sealed dirty segment?)")
    return {
        "log_mb_before": round(size_before / MB, 1), "log_mb_after": round(partition_log.size_bytes() / MB, 2),
        "cleaned_mb": round(stats.compaction.bytes_in / MB, 1), "seconds": round(seconds, 3),
        "mb_per_s": round(stats.compaction.bytes_in / MB / seconds, 1),
        "records_per_s": round(stats.compaction.records_in / seconds), "records_in": stats.compaction.records_in,
        "records_kept": stats.compaction.records_kept, "map_keys": stats.map_keys,
        "map_s": round(stats.map_seconds, 3), "clean_s": round(seconds - stats.map_seconds, 3),
        "map_mb": round(stats.map_bytes_read / MB, 1), "segments_in": stats.segments_in,
    }


def measure(records: int, keys: int, batch_records: int, segment_mb: int, compression: str) -> dict[str, Any]:
    from broker.log import LogCleaner

    directory = harness.make_temp_dir("pymq-bench-cleaner-")
    manager, partition_log = build_log(directory / "data", records, keys, batch_records, segment_mb * MB, compression)
    try:
        cleaner = LogCleaner(manager, clock=lambda: TIMESTAMP_MS)
        harness.wait_for_writeback()
        first = timed_round(cleaner, partition_log)
        # Two segments' worth, so that whatever the active segment held is sealed and dirty now.
        more = 2 * segment_mb * MB // (VALUE_BYTES + KEY_BYTES)
        append_updates(partition_log, more, keys, batch_records, compression, seed=2)
        harness.wait_for_writeback()
        second = timed_round(cleaner, partition_log)
    finally:
        manager.close()
        harness.remove_temp_dir(directory)
    return {"compression": compression, "records": records, "keys": keys, "batch_records": batch_records,
            "segment_mb": segment_mb, "first_round": first, "second_round": second}


def summary(results: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    for run in results.get("runs", []):
        for name in ("first_round", "second_round"):
            r = run[name]
            rows.append(SummaryRow(
                f"log cleaner {name.replace('_', ' ')}, {run['records']:,} x 100 B over {run['keys']:,} keys, {run['compression']}",
                "(report)", f"{r['mb_per_s']:.0f} MB/s, {harness.rate(r['records_per_s'])}", None,
                f"{r['cleaned_mb']} MB cleaned in {r['seconds']} s (map {r['map_s']} s); log "
                f"{r['log_mb_before']} -> {r['log_mb_after']} MB"))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.log_cleaner", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--segment-mb", type=int, default=16)
    parser.add_argument("--compression", nargs="*", default=["none", "lz4"], choices=["none", "lz4", "zstd"])
    parser.add_argument("--quick", action="store_true", help="20x fewer records")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    harness.install_cleanup()
    harness.warm_up_arrow()
    runs = []
    for compression in args.compression:
        harness.wait_for_quiet()
        runs.append(measure(harness.scaled(args.records, args.quick), args.keys, args.batch_records,
                            harness.scaled(args.segment_mb, args.quick), compression))
    rows = [{"compression": run["compression"], "round": name.split("_")[0], **run[name]}
            for run in runs for name in ("first_round", "second_round")]
    harness.print_table("log cleaner", rows, ["compression", "round", "log_mb_before", "log_mb_after", "cleaned_mb",
                                              "seconds", "mb_per_s", "records_per_s", "map_s", "clean_s", "map_keys"])
    results = {"runs": runs, "summary": [row.as_dict() for row in summary({"runs": runs})]}
    print(f"wrote {harness.write_results('log_cleaner', results)}")
    return results


if __name__ == "__main__":
    main()
