"""Table topics: `history()` over a synced Delta table against plain Parquet, `format("pymq")` from
brokers and from the S3 tier, and `table sync` throughput.

One broker tiering a topic of `--records` 100-byte values to a moto S3 bucket (every segment
uploaded and deleted locally: benchmarks/tiered_storage.py's TieredTopic), Spark local[2] in this
process. Then:

- sync:     `pymq table sync`'s query (jobs/topic_table.py, Trigger.AvailableNow, one batch) from
            the broker (which serves the tier) into a local Delta table: sustained rows/s.
- history:  `history(spark, topic, table=...)` with the table caught up (the broker tail is empty,
            but planned and asked for: its fixed cost is part of the time), against the same
            rows written once (untimed) as a plain Parquet folder, and against `format("pymq")`
            reading the same offsets from the broker and straight from the S3 tier
            (`remoteStorage.url`). Each source runs two queries: `agg` (count and the sum of the
            values' lengths: every value is read) and `noop` (every column materialized into the
            `noop` sink); best of `--repeat`.

    python -m benchmarks.table_topics [--records 10000000] [--partitions 4] [--repeat 3] [--quick]
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import harness
from benchmarks.harness import SummaryRow
from benchmarks.tiered_storage import TOPIC, TieredTopic, timed

DEFAULT_RECORDS = 10_000_000
SEGMENT_BYTES = 64 << 20


def sync_table(spark: Any, tiered: TieredTopic) -> dict[str, Any]:
    from jobs.topic_table import SyncOptions, sync

    table = str(tiered.work / "table")
    harness.wait_for_quiet()
    started = time.perf_counter()
    writer = sync(spark, SyncOptions(TOPIC, table, tiered.broker.bootstrap))
    seconds = time.perf_counter() - started
    rows = sum(int(b["rows"]) for b in writer.batches)
    return {"table": table, "rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds),
            "batches": len(writer.batches), "table_bytes": harness.dir_size_bytes(tiered.work / "table")}


def read_all(spark: Any, tiered: TieredTopic, table: str, repeat: int) -> dict[str, Any]:
    from pymq import history

    parquet = tiered.work / "same-rows.parquet"
    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    spark.read.format("delta").load(table).select(*columns).write.mode("overwrite").parquet(str(parquet))
    base = {"kafka.bootstrap.servers": tiered.broker.bootstrap, "subscribe": TOPIC,
            "endingOffsets": tiered.ending_offsets()}
    sources = {
        "history": lambda: history(spark, TOPIC, table=table, bootstrap=tiered.broker.bootstrap).select(*columns),
        "parquet": lambda: spark.read.parquet(str(parquet)),
        "pymq_broker": lambda: spark.read.format("pymq").options(**base).load(),
        "pymq_s3": lambda: spark.read.format("pymq").options(**base, **{"remoteStorage.url": tiered.url},
                                                             **tiered.moto.spark_options()).load(),
    }
    out: dict[str, Any] = {"parquet_bytes": harness.dir_size_bytes(parquet)}
    for kind in ("agg", "noop"):
        times: dict[str, list[float]] = {name: [] for name in sources}
        answers: dict[str, Any] = {}
        for _ in range(repeat):
            for name, frame in sources.items():  # interleaved: drift hits every source alike
                harness.wait_for_quiet()
                seconds, answer = timed(frame(), kind)
                times[name].append(round(seconds, 2))
                answers[name] = answer
        out[kind] = {"seconds": times, "answers": {k: list(v) if v else None for k, v in answers.items()}}
        print(kind, times, answers, flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.table_topics", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes")
    args = parser.parse_args(argv)
    records = harness.scaled(args.records, args.quick)
    harness.install_cleanup()
    from spark_datasource import local_spark

    tiered = TieredTopic(records, args.partitions, SEGMENT_BYTES, cache_bytes=256 << 20)
    results: dict[str, Any] = {"records": records, "partitions": args.partitions}
    try:
        tiered.start()
        results["topic"] = tiered.info
        spark = local_spark("pymq-table-bench", **{"spark.driver.memory": "4g"})
        try:
            results["sync"] = sync_table(spark, tiered)
            print("sync", results["sync"], flush=True)
            results["read"] = read_all(spark, tiered, results["sync"]["table"], args.repeat)
        finally:
            spark.stop()
    finally:
        tiered.stop()
    results["summary"] = [row.as_dict() for row in summary(results)]
    harness.print_table("table topics", results["summary"])
    print("wrote", harness.write_results("table_topics", results))
    return results


def summary(results: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    sync = results.get("sync")
    if sync:
        rows.append(SummaryRow(f"`table sync` of {sync['rows']:,} x 100 B (broker reading the S3 tier)", "(report)",
                               harness.rate(sync["rows_per_s"]), None,
                               f"{sync['seconds']} s, {sync['batches']} batch(es), table {sync['table_bytes'] / 2**20:.0f} MiB"))
    read = results.get("read")
    if read:
        for kind in ("agg", "noop"):
            best = {name: min(seconds) for name, seconds in read[kind]["seconds"].items()}
            ratio = best["parquet"] / best["history"]
            rows.append(SummaryRow(f"`history()` over the table, {kind}", ">= 0.9x Parquet",
                                   f"{best['history']:.2f} s ({ratio:.2f}x Parquet)", ratio >= 0.9,
                                   f"Parquet {best['parquet']:.2f} s; format(\"pymq\") from the broker "
                                   f"{best['pymq_broker']:.2f} s, from the S3 tier {best['pymq_s3']:.2f} s; "
                                   f"best of {len(read[kind]['seconds']['history'])}"))
    return rows


if __name__ == "__main__":
    main()
