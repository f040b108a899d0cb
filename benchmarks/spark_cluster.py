"""`format("pymq")` on a Spark standalone cluster and over Spark Connect, against local[2].

One broker process; a topic of `--partitions` partitions loaded with `--records` 100-byte values.
The same driver program (this file, `--measure SPEC`) then runs in three deployments on this
machine, one after the other, each timing:

- batch_read:  `spark.read.format("pymq")` of the whole topic into the `noop` sink (best of `--repeat`);
- stream_noop: `readStream.format("pymq")`, Trigger.AvailableNow with maxOffsetsPerTrigger of a
               fifth of the topic, into `noop`: rows / wall time of the query.

Deployments:

- local:      `spark-submit --master local[2]` (the driver and its tasks in one JVM);
- standalone: `spark-submit --master spark://...` to a Master and a Worker of 2 cores started from
              pyspark's `bin/spark-class` (spark_datasource/spark_daemons.py): the tasks run in an
              executor JVM of their own, whose Python workers fetch from the broker;
- connect:    a Spark Connect server on local[2] (`spark-submit --class SparkConnectServer`) and
              this program as its remote client (`SparkSession.builder.remote`): the cost of the
              client/server hop over local.

    python -m benchmarks.spark_cluster [--records 10000000] [--partitions 4] [--quick] [--only local standalone connect]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    # Run as a file (spark-submit runs the driver so): benchmarks/profile.py would shadow the
    # standard library's `profile`, which pyspark imports. The repository is on PYTHONPATH.
    sys.path.pop(0)

from benchmarks import harness
from benchmarks.harness import SummaryRow

DEFAULT_RECORDS = 10_000_000
DEPLOYMENTS = ["local", "standalone", "connect"]
DRIVER_TIMEOUT_S = 1800


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """The driver side: both workloads in the session this process gets (spark-submit's or a remote one)."""
    from pyspark.sql import SparkSession

    from benchmarks.spark_source import stream_noop, timed_noop
    from spark_datasource import register

    remote = spec.get("remote")
    spark = (SparkSession.builder.remote(remote) if remote else SparkSession.builder).getOrCreate()
    register(spark)
    try:
        bootstrap, topic, records = spec["bootstrap"], spec["topic"], spec["records"]
        reader = spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        read_s = [timed_noop(reader.load()) for _ in range(spec["repeat"])]
        stream = stream_noop(spark, bootstrap, topic, Path(spec["work"]), max(records // 5, 1))
        if stream["records"] != records:
            raise RuntimeError(f"the stream read {stream['records']} of {records} rows")
        return {"batch_read": {"records": records, "seconds": read_s, "rows_per_s": round(records / min(read_s))},
                "stream_noop": stream}
    finally:
        spark.stop()


def run_driver(args: list[str], spec: dict[str, Any], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run `args` (a driver command ending in this module) with `--measure SPEC`; its results."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out = work / "spec.json", work / "results.json"
    spec_path.write_text(json.dumps({**spec, "work": str(work), "out": str(out)}))
    with open(work / "driver.log", "ab") as log:
        code = subprocess.run([*args, "--measure", str(spec_path)], stdout=log, stderr=subprocess.STDOUT,
                              env=env, timeout=DRIVER_TIMEOUT_S).returncode
    if code != 0:
        raise RuntimeError(f"driver failed ({code}); log {work / 'driver.log'}:\n"
                           f"{(work / 'driver.log').read_text(errors='replace')[-4000:]}")
    return json.loads(out.read_text())


def deployment(name: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    from spark_datasource.spark_daemons import LOG4J, ConnectServer, StandaloneCluster, spark_env, submit_args

    script = str(Path(__file__).resolve())
    conf = {"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"}
    quiet = {**conf, "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={LOG4J.as_uri()}"}
    env = spark_env()
    if name == "local":
        return run_driver([*submit_args("local[2]", quiet), script], spec, work, env)
    if name == "standalone":
        cluster = StandaloneCluster(work / "cluster", cores=2, memory="3g").start()
        try:
            return run_driver([*cluster.submit_args({**quiet, "spark.executor.memory": "2g"}), script], spec, work, env)
        finally:
            cluster.stop()
    server = ConnectServer(work / "server", conf=conf).start_server()  # at Spark's INFO log: its ready line
    try:
        return run_driver([sys.executable, script], {**spec, "remote": server.url}, work, env)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="20x fewer records")
    parser.add_argument("--only", nargs="*", choices=DEPLOYMENTS, default=DEPLOYMENTS)
    parser.add_argument("--repeat", type=int, default=2, help="timed batch reads per deployment (best is reported)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the driver side: a spec file
    args = parser.parse_args(argv)
    if args.measure:
        spec = json.loads(Path(args.measure).read_text())
        Path(spec["out"]).write_text(json.dumps(measure(spec)))
        return {}
    records = harness.scaled(args.records, args.quick)
    harness.install_cleanup()
    from benchmarks.spark_source import load_topic

    broker = harness.BrokerProcess(harness.broker_overrides()).start()
    work = harness.make_temp_dir("pymq-spark-cluster-bench-")
    results: dict[str, Any] = {"records": records, "partitions": args.partitions}
    try:
        topic = "bench"
        harness.create_topic(broker.bootstrap, topic, args.partitions, {"segment.bytes": 256 << 20})
        results["load_s"] = round(load_topic(broker.bootstrap, topic, records), 2)
        spec = {"bootstrap": broker.bootstrap, "topic": topic, "records": records, "repeat": args.repeat}
        for name in args.only:
            results[name] = deployment(name, spec, work / name)
            print(name, results[name], flush=True)
    finally:
        broker.stop()
        harness.remove_temp_dir(work)
    results["summary"] = [row.as_dict() for row in summary(results)]
    harness.print_table("spark cluster", results["summary"])
    print("wrote", harness.write_results("spark_cluster", results))
    return results


def summary(results: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    local = results.get("local")
    for name in DEPLOYMENTS:
        found = results.get(name)
        if not found:
            continue
        for workload, label in (("batch_read", "batch read into noop"), ("stream_noop", "streaming read into noop (AvailableNow)")):
            rate = found[workload]["rows_per_s"]
            vs_local = f"{rate / local[workload]['rows_per_s']:.2f}x local[2]" if local else ""
            rows.append(SummaryRow(f"Spark {label}, {results['records']:,} x 100 B, {name}", "(report)",
                                   harness.rate(rate), None, vs_local))
    return rows


if __name__ == "__main__":
    main()
