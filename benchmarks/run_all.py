"""Run every benchmark with its defaults and print the summary table in the README's format.

    python -m benchmarks.run_all                    # full volumes (~30 min on 2 cores)
    python -m benchmarks.run_all --quick            # every volume ~20x smaller (~2 min)
    python -m benchmarks.run_all --memory-gb 4      # a smaller memory run
    python -m benchmarks.run_all --skip memory      # leave some out (produce, eos, consume, latency, partitions, cluster, spark, tiered, tables, groups, cleaner, looplag, memory)
    python -m benchmarks.run_all --profile          # also run the py-spy profiles (benchmarks.profile)

`make bench` runs `python -m benchmarks.run_all`. Each benchmark writes
benchmarks/results/<name>.json; this writes results/summary.json and prints the markdown table.
"""
from __future__ import annotations

import argparse
from datetime import date
from typing import Any

from benchmarks import (
    cluster,
    consume_throughput,
    exactly_once,
    groups,
    harness,
    latency,
    log_cleaner,
    loop_lag,
    memory,
    partitions,
    produce_throughput,
    spark_source,
    table_topics,
    tiered_storage,
)
from benchmarks.harness import SummaryRow

ORDER = ["produce", "eos", "consume", "latency", "partitions", "cluster", "spark", "tiered", "tables", "groups", "cleaner", "looplag",
         "memory"]


def main(argv: list[str] | None = None) -> list[SummaryRow]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shrink every volume ~20x")
    parser.add_argument("--memory-gb", type=float, default=10.0, help="GiB to ingest in the memory benchmark [10]")
    parser.add_argument("--skip", nargs="*", choices=ORDER, default=[], help="benchmarks to leave out")
    parser.add_argument("--profile", action="store_true", help="also run python -m benchmarks.profile")
    parser.add_argument("--summarize-only", action="store_true",
                        help="run nothing: rebuild the summary table from the results/*.json already there")
    args = parser.parse_args(argv)
    if args.summarize_only:
        return summarize_existing()
    harness.install_cleanup()
    quick = ["--quick"] if args.quick else []
    rows: list[SummaryRow] = []
    done: dict[str, Any] = {}
    if "produce" not in args.skip:
        print("\n### produce throughput", flush=True)
        done["produce"] = produce_throughput.main(quick)
    if "eos" not in args.skip:
        print("\n### exactly once: the idempotent producer's cost, transactions", flush=True)
        done["eos"] = {"summary": [r.as_dict() for r in exactly_once.summary(exactly_once.main(quick))]}
    if "consume" not in args.skip:
        print("\n### consume throughput", flush=True)
        done["consume"] = consume_throughput.main(quick)
    if "latency" not in args.skip:
        print("\n### latency", flush=True)
        done["latency"] = latency.main(quick)
    if "partitions" not in args.skip:
        print("\n### partitions and restarts", flush=True)
        done["partitions"] = partitions.main(["--quick"] if args.quick else [])
    if "cluster" not in args.skip:
        print("\n### a 3-broker cluster", flush=True)
        done["cluster"] = cluster.main(quick)
    if "spark" not in args.skip:
        print("\n### spark source", flush=True)
        done["spark"] = spark_source.main(quick)
    if "tiered" not in args.skip:
        print("\n### tiered storage", flush=True)
        done["tiered"] = tiered_storage.main(quick)
    if "tables" not in args.skip:
        print("\n### table topics", flush=True)
        done["tables"] = table_topics.main(quick)
    if "groups" not in args.skip:
        print("\n### consumer groups", flush=True)
        done["groups"] = groups.main(quick)
    if "cleaner" not in args.skip:
        print("\n### log cleaner", flush=True)
        done["cleaner"] = log_cleaner.main(quick)
    if "looplag" not in args.skip:
        print("\n### event-loop lag under produce floods", flush=True)
        done["looplag"] = loop_lag.main(quick)
    if "memory" not in args.skip:  # last: the longest
        print("\n### memory", flush=True)
        try:
            done["memory"] = memory.main(["--volume-gb", str(args.memory_gb)] + quick)
        except SystemExit as refusal:  # not enough free disk
            print(refusal, flush=True)
            rows_skipped = [SummaryRow(f"broker RSS while ingesting {args.memory_gb:g} GiB", "< 300 MB", "not run", None,
                                       str(refusal))]
            done["memory"] = {"summary": [r.as_dict() for r in rows_skipped]}
    if args.profile:
        from benchmarks import profile

        print("\n### profiles", flush=True)
        profile.main(["--send-records", "400000", "--batch-records", "4000000", "--batch1k-records", "400000",
                      "--consume-records", "1500000", "--latency-s", "5"] if args.quick else [])
    for name in ORDER:
        if name in done:
            rows += [SummaryRow(**r) for r in done[name]["summary"]]
    table = harness.markdown_table(rows)
    print(f"\n## Results ({date.today().isoformat()}{', --quick' if args.quick else ''})\n")
    print(table)
    harness.write_results("summary", {"quick": args.quick, "rows": [r.as_dict() for r in rows], "markdown": table})
    return rows


def summarize_existing() -> list[SummaryRow]:
    """Recompute every summary row from the stored results (with the current summary code)."""
    modules = {"produce": (produce_throughput, "produce_throughput"), "eos": (exactly_once, "exactly_once"),
               "consume": (consume_throughput, "consume_throughput"),
               "latency": (latency, "latency"), "partitions": (partitions, "partitions"), "cluster": (cluster, "cluster"),
               "spark": (spark_source, "spark_source"),
               "tiered": (tiered_storage, "tiered_storage"), "tables": (table_topics, "table_topics"),
               "groups": (groups, "groups"), "cleaner": (log_cleaner, "log_cleaner"), "looplag": (loop_lag, "loop_lag"),
               "memory": (memory, "memory")}
    rows: list[SummaryRow] = []
    commits, dates = set(), set()
    for name in ORDER:
        module, file = modules[name]
        result = harness.load_results(file)
        if result is None:
            continue
        commits.add(result.get("machine", {}).get("git", {}).get("commit", "?"))
        dates.add(result.get("date", "?"))
        rows += module.summary(result)
    table = harness.markdown_table(rows)
    print(f"\n## Results ({', '.join(sorted(dates))}; commit(s) {', '.join(sorted(commits))})\n")
    print(table)
    harness.write_results("summary", {"rebuilt_from_results": True, "commits": sorted(commits),
                                      "rows": [r.as_dict() for r in rows], "markdown": table})
    return rows


if __name__ == "__main__":
    main()
