"""One broker with very many partitions: how long creating them, a clean stop, a restart and a
second clean stop take (issue: 100k partitions took 128 s to create, 588 s to restart, and a clean
stop did not finish in 300 s).

- creation: `--partitions` (default 100,000) as topics of `--per-topic` (default 10,000, the
  per-topic maximum) partitions, one CreateTopics request per topic, timed from the first request
  to the last response. The broker runs with `max.partitions` raised to the count.
- clean stop: SIGTERM to exit (the broker closes every log: fsync, checkpoints).
- restart: spawn to "listening" on the same directory after the clean stop (every log opened,
  nothing to recover), then a second clean stop.

`--profile` attaches py-spy to the broker during the first clean stop and prints the hottest
functions; the restart's log loading time is the broker's own "loaded N logs in S s" line.

    python -m benchmarks.many_partitions [--partitions 100000] [--per-topic 10000] [--profile]
"""
from __future__ import annotations

import argparse
import re
import time
from typing import Any

from benchmarks import harness
from benchmarks.harness import SummaryRow


def timed_stop(broker: harness.BrokerProcess, timeout_s: float) -> float:
    start = time.monotonic()
    code = broker.stop(timeout_s)
    elapsed = time.monotonic() - start
    if code != 0:
        raise RuntimeError(f"the broker's clean stop exited {code} after {elapsed:.1f} s:\n{broker.log_tail()}")
    return elapsed


def run(partitions: int, per_topic: int, profile: bool, timeout_s: float) -> dict[str, Any]:
    from client import Admin

    overrides = harness.broker_overrides(**{"max.partitions": max(partitions, 1)})
    broker = harness.BrokerProcess(overrides).start(timeout_s)
    profiler = harness.Profiler(harness.RESULTS_DIR / "profiles", tag="many_partitions-") if profile else None
    result: dict[str, Any] = {"partitions": partitions, "per_topic": per_topic}
    try:
        start = time.monotonic()
        created, topic = 0, 0
        with Admin(broker.bootstrap, request_timeout_ms=int(timeout_s * 1000)) as admin:
            while created < partitions:
                count = min(per_topic, partitions - created)
                admin.create_topic(f"many-{topic}", count)
                created, topic = created + count, topic + 1
        result["create_s"] = time.monotonic() - start
        result["rss_mb_after_create"] = broker.rss_mb()
        print(f"created {partitions} partitions in {topic} topics: {result['create_s']:.1f} s", flush=True)
        if profiler is not None:
            profiler.attach("broker-first-stop", broker.pid)
        result["stop_s"] = timed_stop(broker, timeout_s)
        print(f"clean stop: {result['stop_s']:.1f} s", flush=True)

        start = time.monotonic()
        broker.start(timeout_s)
        result["restart_s"] = time.monotonic() - start
        loads = re.findall(r"loaded \d+ logs in ([\d.]+) s", broker.log_tail(1_000_000))
        result["restart_log_load_s"] = float(loads[-1]) if loads else None
        print(f"restart: {result['restart_s']:.1f} s (loading the logs {result['restart_log_load_s']} s)", flush=True)
        result["second_stop_s"] = timed_stop(broker, timeout_s)
        print(f"second clean stop: {result['second_stop_s']:.1f} s", flush=True)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()
        if profiler is not None:
            result["profiles"] = profiler.stop()
        harness.remove_temp_dir(broker.data_dir)
    return result


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    n = f"{result['partitions']:,}"
    return [
        SummaryRow(f"create {n} partitions (topics of {result['per_topic']:,})", "-", f"{result['create_s']:.1f} s", None),
        SummaryRow(f"clean stop with {n} partitions", "bounded", f"{result['stop_s']:.1f} s", None),
        SummaryRow(f"restart with {n} partitions", "bounded", f"{result['restart_s']:.1f} s", None),
        SummaryRow(f"second clean stop with {n} partitions", "bounded", f"{result['second_stop_s']:.1f} s", None),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--per-topic", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true", help="py-spy the broker during the first clean stop")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="limit for each start and stop")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.partitions, args.per_topic, args.profile, args.timeout_s)
    result["machine"] = harness.machine_info()
    harness.print_table("many partitions", [{k: v for k, v in result.items() if k not in ("profiles", "machine")}])
    for name, prof in (result.get("profiles") or {}).items():
        print(name, prof)
    harness.write_results("many_partitions", result)
    return result


if __name__ == "__main__":
    main()
