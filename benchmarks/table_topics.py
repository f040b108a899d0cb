"""Table topics: `history()` over a synced Delta table against plain Parquet, `format("pymq")` from
brokers and from the S3 tier, and `table sync` throughput.

One broker tiering a topic of `--records` 100-byte values to a moto S3 bucket (every segment
uploaded and deleted locally: benchmarks/tiered_storage.py's TieredTopic), Spark local[2] in this
process. Then:

- sync:     `pymq table sync`'s query (jobs/topic_table.py, Trigger.AvailableNow, one batch) from
            the broker (which serves the tier) into a local Delta table: sustained rows/s.
- history:  `history(spark, topic, table=...)` with the table caught up (the broker tail is empty,
            but asked for), against the same rows written once (untimed) as a plain Parquet
            folder, and against `format("pymq")` reading the same offsets from the broker and
            straight from the S3 tier (`remoteStorage.url`). Each source runs two queries: `agg`
            (count and the sum of the values' lengths: every value is read) and `noop` (every
            column materialized into the `noop` sink). A time is what a user waits for: building
            the DataFrame (for history(), reading the table's log and asking the broker for its
            end offsets) plus the query. One untimed round warms the JVM's JIT first; then
            `--repeat` rounds, the sources back to back in each, each round in another order;
            the median and the best. `delta` (the same table read by Delta Lake alone, with no
            pymq) is what history() would take through Delta's reader; the result says which
            reader history() used (`table_reader` `auto`) and over how many files.
- compaction: the `compact` job's per-partition work (jobs/compact.py `compact_partition`:
            download, offset map, compaction, segment writing, upload with verification) over a
            file:// tier holding the log_cleaner benchmark's log (`--cleaner-records` updates of
            100 B over `--cleaner-keys` keys in 16 MiB segments), against the broker's log cleaner
            cleaning that same log (its first round, benchmarks/log_cleaner.py).

    python -m benchmarks.table_topics [--records 10000000] [--partitions 4] [--repeat 7] [--quick]
                                      [--only sync history compaction]
"""
from __future__ import annotations

import argparse
import statistics
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
        "delta": lambda: spark.read.format("delta").load(table).select(*columns),  # Delta's reader alone
        "parquet": lambda: spark.read.parquet(str(parquet)),
        "pymq_broker": lambda: spark.read.format("pymq").options(**base).load(),
        "pymq_s3": lambda: spark.read.format("pymq").options(**base, **{"remoteStorage.url": tiered.url},
                                                             **tiered.moto.spark_options()).load(),
    }
    from spark_datasource.table_topic import TableTopic

    mirrored = TableTopic(spark, table)
    files = mirrored.log.snapshot_files(mirrored.position().version, None)
    out: dict[str, Any] = {"parquet_bytes": harness.dir_size_bytes(parquet), "table_files": len(files.paths),
                           "history_reader": "delta" if "DeltaFileIndex" in sources["history"]()._jdf.queryExecution()
                           .executedPlan().toString() else "parquet"}
    print("read", out, flush=True)
    names = list(sources)
    for kind in ("agg", "noop"):
        for frame in sources.values():  # warm-up: the JIT compiles the read paths before any timing
            timed(frame(), kind)
        times: dict[str, list[float]] = {name: [] for name in sources}
        answers: dict[str, Any] = {}
        for round_ in range(repeat):
            harness.wait_for_quiet()  # once per round: the sources then run back to back, each round in another order
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                started = time.perf_counter()
                _, answer = timed(sources[name](), kind)
                times[name].append(round(time.perf_counter() - started, 2))
                answers[name] = answer
        out[kind] = {"seconds": times, "answers": {k: list(v) if v else None for k, v in answers.items()}}
        print(kind, times, answers, flush=True)
    return out


def compaction_vs_cleaner(records: int, keys: int, segment_bytes: int) -> dict[str, Any]:
    from benchmarks.log_cleaner import TIMESTAMP_MS, build_log, timed_round
    from broker.log import LogCleaner
    from jobs.compact import PartitionPlan, compact_partition
    from segment_format.manifest import PartitionManifest
    from tiered_storage import RemoteSegmentStore

    directory = harness.make_temp_dir("pymq-bench-compact-")
    manager, partition_log = build_log(directory / "data", records, keys, 1000, segment_bytes, "none")
    try:
        url = f"file://{directory / 'remote'}"
        store = RemoteSegmentStore.from_url(url)
        manifest = PartitionManifest.empty("compacted", 0)
        for segment in partition_log.segments()[:-1]:  # the sealed ones, as tiering uploads them
            manifest = store.commit_manifest(manifest.version, manifest.with_segment(
                store.upload_segment("compacted", 0, segment.files)))
        plan = PartitionPlan("compacted", 0, "", manifest.version, tuple(s.to_dict() for s in manifest.segments), url, (),
                             TIMESTAMP_MS, 86_400_000, 5_000_000, segment_bytes)
        harness.wait_for_writeback()
        harness.wait_for_quiet()
        started = time.perf_counter()
        result = compact_partition(plan)
        job_s = time.perf_counter() - started
        harness.wait_for_writeback()
        harness.wait_for_quiet()
        cleaner = timed_round(LogCleaner(manager, clock=lambda: TIMESTAMP_MS), partition_log)
    finally:
        manager.close()
        harness.remove_temp_dir(directory)
    return {"records": records, "keys": keys, "remote_segments": len(manifest.segments),
            "job": {"seconds": round(job_s, 2), "records_in": result.records_in, "records_kept": result.records_kept,
                    "records_per_s": round(result.records_in / job_s), "mb_per_s": round(result.bytes_in / 2**20 / job_s, 1)},
            "cleaner": cleaner}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.table_topics", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes")
    parser.add_argument("--only", nargs="*", choices=["sync", "history", "compaction"], default=["sync", "history", "compaction"])
    parser.add_argument("--cleaner-records", type=int, default=1_000_000)
    parser.add_argument("--cleaner-keys", type=int, default=10_000)
    args = parser.parse_args(argv)
    records = harness.scaled(args.records, args.quick)
    harness.install_cleanup()
    results: dict[str, Any] = {"records": records, "partitions": args.partitions}
    if "compaction" in args.only:
        results["compaction"] = compaction_vs_cleaner(harness.scaled(args.cleaner_records, args.quick), args.cleaner_keys,
                                                      harness.scaled(16, args.quick) << 20)
        print("compaction", results["compaction"], flush=True)
    if {"sync", "history"} & set(args.only):
        sync_and_history(results, records, args)
    results["summary"] = [row.as_dict() for row in summary(results)]
    harness.print_table("table topics", results["summary"])
    print("wrote", harness.write_results("table_topics", results))
    return results


def sync_and_history(results: dict[str, Any], records: int, args: argparse.Namespace) -> None:
    from spark_datasource import local_spark

    tiered = TieredTopic(records, args.partitions, SEGMENT_BYTES, cache_bytes=256 << 20)
    try:
        tiered.start()
        results["topic"] = tiered.info
        spark = local_spark("pymq-table-bench", **{"spark.driver.memory": "4g"})
        try:
            results["sync"] = sync_table(spark, tiered)
            print("sync", results["sync"], flush=True)
            if "history" in args.only:
                results["read"] = read_all(spark, tiered, results["sync"]["table"], args.repeat)
        finally:
            spark.stop()
    finally:
        tiered.stop()


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
            median = {name: statistics.median(seconds) for name, seconds in read[kind]["seconds"].items()}
            best = {name: min(seconds) for name, seconds in read[kind]["seconds"].items()}
            ratio = median["parquet"] / median["history"]
            rows.append(SummaryRow(f"`history()` over the table, {kind}", ">= 0.9x Parquet",
                                   f"{median['history']:.2f} s ({ratio:.2f}x Parquet)", ratio >= 0.9,
                                   f"median of {len(read[kind]['seconds']['history'])} (best: history() "
                                   f"{best['history']:.2f} s, {best['parquet'] / best['history']:.2f}x); Parquet "
                                   f"{median['parquet']:.2f} s; Delta alone {median['delta']:.2f} s "
                                   f"({median['parquet'] / median['delta']:.2f}x); format(\"pymq\") from the broker "
                                   f"{median['pymq_broker']:.2f} s, from the S3 tier {median['pymq_s3']:.2f} s"))
    compaction = results.get("compaction")
    if compaction:
        job, cleaner = compaction["job"], compaction["cleaner"]
        rows.append(SummaryRow(f"`compact` job vs the broker's cleaner, {compaction['records']:,} x 100 B over "
                               f"{compaction['keys']:,} keys", "(report)",
                               f"{harness.rate(job['records_per_s'])} ({job['records_per_s'] / cleaner['records_per_s']:.2f}x the cleaner)",
                               None, f"one partition, {compaction['remote_segments']} remote segments (file://) in "
                               f"{job['seconds']} s; the cleaner {harness.rate(cleaner['records_per_s'])} in {cleaner['seconds']} s"))
    return rows


if __name__ == "__main__":
    main()
