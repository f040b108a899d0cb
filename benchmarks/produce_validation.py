"""The cost of the leader's body validation (issue 34): what checking a producer's batch costs the
broker since it decodes and validates each body in full before the append.

Two parts:

1. `check` (in process, one thread): `record.validate_batch` per batch as the leader ran it
   before (header, CRC, IPC metadata: what followers and recovery still run) and as it runs it
   now (with producer input: also the decompressed-size bound, the body decoded and validated in
   full by Arrow, the timestamp column's min/max), for 100 B and 1 KiB values, compression none,
   lz4 and zstd, batches of 1 and 100 records and of the producer's default 256 KiB batch_size.
   Best of 5 timings of >= 0.2 s each (least disturbed by the rest of the machine).
2. `produce` (`--produce`): produce throughput end to end (`send_batch`, acks=1, one producer
   process, 3 partitions) for the same values and compressions, with the broker CPU it took per
   record; `--broker-code DIR` runs the broker from another source tree (e.g. an export of the
   commit before: `git archive <commit> | tar -x -C DIR`) with the same clients, for a before
   and after pair.

    python -m benchmarks.produce_validation                          # part 1 only (~1 min)
    python -m benchmarks.produce_validation --produce [--broker-code DIR] [--records-100 N]

Values are random uppercase letters, as in every benchmark here: lz4 barely compresses them
(so most lz4 bodies are written uncompressed: `encode_body` keeps the smaller), zstd to ~60 %.
Writes benchmarks/results/produce_validation[_<tag>].json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks import harness

VALUE_SIZES = (100, 1024)
COMPRESSIONS = ("none", "lz4", "zstd")
BATCH_BYTES = 256 << 10  # the producer's default batch_size
TIMESTAMP_MS = 1_700_000_000_000
PRODUCE_RECORDS = {100: 2_000_000, 1024: 300_000}


def _best_us(call: Callable[[], Any], rounds: int = 5, min_s: float = 0.2) -> float:
    """Microseconds per call: the best of `rounds` timings of enough calls to last `min_s`."""
    call()
    n, best = 1, float("inf")
    for _ in range(rounds):
        while True:
            start = time.perf_counter()
            for _ in range(n):
                call()
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
            n = max(2 * n, int(n * min_s / max(elapsed, 1e-9)))
        best = min(best, elapsed / n)
    return best * 1e6


def check_costs() -> list[dict[str, Any]]:
    """Part 1: validate_batch before (no producer input) and now (producer input), per batch."""
    from segment_format import batch_body, record

    rows = []
    for size in VALUE_SIZES:
        for records in (1, 100, BATCH_BYTES // size):
            values = harness.value_table(harness.payload_buffer(size, records), size, records).column("value")
            body = batch_body.make_body(values.combine_chunks(), timestamps_ms=TIMESTAMP_MS)
            for compression in COMPRESSIONS:
                batch = record.encode_batch(body, compression=compression)
                producer = record.ProducerInput(TIMESTAMP_MS, None, 64 << 20)
                before = _best_us(lambda: record.validate_batch(batch))
                after = _best_us(lambda: record.validate_batch(batch, producer=producer))
                compressed = record.read_header(batch).size < len(record.encode_batch(body))
                rows.append({"value_bytes": size, "records": records, "compression": compression,
                             "stored_compressed": compressed, "batch_bytes": len(batch),
                             "before_us": round(before, 1), "after_us": round(after, 1),
                             "added_us": round(after - before, 1), "added_ns_per_record": round((after - before) * 1000 / records),
                             "after_records_per_s": round(records / after * 1e6),
                             "after_mb_per_s": round(records * size / after * 1e6 / harness.MB)})
                print(f"  {size:5d} B x {records:5d} {compression:4s}: before {before:8.1f} us, after {after:8.1f} us "
                      f"(+{after - before:.1f} us; {records / after:.2f} M records/s of one core)", flush=True)
    return rows


def produce_costs(broker_code: str | None, records_by_size: dict[int, int]) -> list[dict[str, Any]]:
    """Part 2: end-to-end produce throughput and the broker's CPU per record."""
    from benchmarks.produce_throughput import run_one

    broker = harness.BrokerProcess(harness.broker_overrides())
    if broker_code is not None:  # that tree's code and its conf/broker.toml (which knows its configs)
        broker.cwd = Path(broker_code)
        broker.config_file = Path(broker_code) / "conf" / "broker.toml"
        broker.env = {"PYTHONPATH": broker_code}
    broker.start()
    rows = []
    try:
        for size in VALUE_SIZES:
            for compression in COMPRESSIONS:
                row = run_one(broker, f"validate{size}", "batch", size, records_by_size[size],
                              {"batch_size": BATCH_BYTES, "linger_ms": 5, "compression": compression}, 3)
                broker_s = row.get("broker_cpu_pct", 0) / 100 * row["elapsed_s"]
                row["broker_cpu_us_per_record"] = round(broker_s / row["records"] * 1e6, 3)
                rows.append(row)
                print(f"  {size:5d} B {compression:4s}: {row['records_per_s']:>12,.0f} msg/s {row['mb_per_s']:>7,.1f} MB/s, "
                      f"broker {row['broker_cpu_us_per_record']} us CPU per record "
                      f"(rest of machine {row.get('other_cpu_pct', '?')}%)", flush=True)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    return rows


CHECK_COLUMNS = ["value_bytes", "records", "compression", "stored_compressed", "batch_bytes", "before_us", "after_us",
                 "added_us", "added_ns_per_record", "after_records_per_s", "after_mb_per_s"]
PRODUCE_COLUMNS = ["workload", "compression", "records", "elapsed_s", "records_per_s", "mb_per_s",
                   "broker_cpu_pct", "broker_cpu_us_per_record", "other_cpu_pct"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.produce_validation", description=__doc__.split("\n")[0])
    parser.add_argument("--produce", action="store_true", help="also part 2: end-to-end produce throughput")
    parser.add_argument("--skip-check", action="store_true", help="leave out part 1")
    parser.add_argument("--broker-code", default=None, help="run the broker from this source tree (part 2)")
    parser.add_argument("--records-100", type=int, default=PRODUCE_RECORDS[100], help="records of 100 B per run")
    parser.add_argument("--records-1k", type=int, default=PRODUCE_RECORDS[1024], help="records of 1 KiB per run")
    parser.add_argument("--tag", default="", help="results/produce_validation_<tag>.json")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result: dict[str, Any] = {"broker_code": args.broker_code}
    if not args.skip_check:
        result["check"] = check_costs()
        harness.print_table("validate_batch per batch, before / now (us)", result["check"], CHECK_COLUMNS)
    if args.produce:
        result["produce"] = produce_costs(args.broker_code, {100: args.records_100, 1024: args.records_1k})
        harness.print_table("produce throughput (send_batch, acks=1, 3 partitions)", result["produce"], PRODUCE_COLUMNS)
    print("wrote", harness.write_results("produce_validation" + (f"_{args.tag}" if args.tag else ""), result))
    return result


if __name__ == "__main__":
    main()
