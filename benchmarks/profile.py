"""Profile the producer, consumer and broker processes under load with py-spy.

Each scenario starts a broker, runs one client workload in its own process and attaches
`py-spy record --format raw --threads --rate R` to the client and to the broker for the whole
timed part of the run. The raw files go to benchmarks/results/profiles/ (gitignored) and a summary
(self time per function with its hottest line, inclusive time) to results/profile.json.

Percentages are of the process's sampled CPU time (py-spy leaves out idle threads), all threads
together; `approx_cores_busy` is samples / (wall seconds x rate).

Scenarios:
- produce_send:    per-record Producer.send(), 100 B values
- produce_batch:   Producer.send_batch(), 100 B values, batch_size 1 MiB
- produce_batch1k: Producer.send_batch(), 1 KiB values, batch_size 1 MiB
- consume_arrow:   Consumer.poll_arrow() over a pre-loaded topic (uvloop broker: pread + write)
- consume_records: Consumer.poll() over the same topic
- consume_arrow_asyncio: poll_arrow against the asyncio broker (sendfile)
- latency:         10,000 msg/s, linger_ms=0, sync producer + per-record poll() consumer + broker

    python -m benchmarks.profile [--scenarios produce_send consume_arrow ...] [--rate 200] [--tmpfs]
"""
from __future__ import annotations

import argparse
import tempfile
from typing import Any

from benchmarks import harness
from benchmarks.harness import GB, KB, MB

SCENARIOS = ["produce_send", "produce_batch", "produce_batch1k", "consume_arrow", "consume_records", "consume_arrow_asyncio", "latency"]
PROFILE_BROKER = {"log.retention.check.interval.ms": 1000, "file.delete.delay.ms": 1000}
TOPIC_CONFIGS = {"retention.bytes": 2 * GB, "segment.bytes": 256 * MB}
TMPFS_TOPIC_CONFIGS = {"retention.bytes": 512 * MB, "segment.bytes": 128 * MB}


def _produce(name: str, mode: str, records: int, config: dict[str, Any], rate: int, record_size: int = 100,
             temp_root: str | None = None) -> dict[str, Any]:
    from benchmarks.produce_throughput import BASE_CONFIG, produce_worker

    broker = harness.BrokerProcess(harness.broker_overrides("uvloop", **PROFILE_BROKER), temp_root=temp_root).start()
    try:
        topic = f"profile-{name}"
        harness.create_topic(broker.bootstrap, topic, 3, TOPIC_CONFIGS if temp_root is None else TMPFS_TOPIC_CONFIGS)
        ready, go = harness.new_event(), harness.new_event()
        worker = harness.Worker(produce_worker, name=f"producer-{name}", bootstrap=broker.bootstrap, topic=topic,
                                mode=mode, records=records, record_size=record_size, config={**BASE_CONFIG, **config},
                                broker_pid=broker.pid, ready=ready, go=go).start()
        if not ready.wait(120):
            raise RuntimeError("producer did not get ready")
        profiler = harness.Profiler(harness.PROFILES_DIR, rate, tag=f"{'tmpfs-' if temp_root else ''}{name}-")
        harness.wait_for_quiet()
        go.set()
        profiler.attach("producer", worker.pid)
        profiler.attach("broker", broker.pid)
        result = worker.result(timeout_s=1800)
        profiles = profiler.stop()
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    return {"workload": result, "profiles": profiles}


def _consume(records: int, rate: int, scenarios: list[str]) -> dict[str, Any]:
    from benchmarks.consume_throughput import load_topic, run_consumer

    out: dict[str, Any] = {}
    data_dir = harness.make_temp_dir()
    topic = "profile-consume"
    try:
        broker = harness.BrokerProcess(harness.broker_overrides("uvloop"), data_dir=data_dir).start()
        try:
            load_topic(broker, topic, 3, records)
        finally:
            broker.stop()
        for scenario in scenarios:
            loop = "asyncio" if scenario.endswith("_asyncio") else "uvloop"
            mode = "records" if scenario == "consume_records" else "arrow"
            broker = harness.BrokerProcess(harness.broker_overrides(loop), data_dir=data_dir, name=f"broker-{loop}").start()
            try:
                profiler = harness.Profiler(harness.PROFILES_DIR, rate, tag=f"{scenario}-")
                result = run_consumer(broker, topic, 3, records, mode, profiler=profiler)
                out[scenario] = {"workload": {k: v for k, v in result.items() if k != "profile"},
                                 "profiles": result["profile"]}
            finally:
                broker.stop()
    finally:
        harness.remove_temp_dir(data_dir)
    return out


def _latency(rate: int, duration_s: float) -> dict[str, Any]:
    from benchmarks import latency

    profiler = harness.Profiler(harness.PROFILES_DIR, rate, tag="latency-")
    row = latency.run_once(10_000, duration_s, 2.0, 0, profiler=profiler)
    profiles = row.pop("profile")
    return {"workload": row, "profiles": profiles}


def run(scenarios: list[str], rate: int = 200, send_records: int = 4_000_000, batch_records: int = 40_000_000,
        consume_records: int = 15_000_000, latency_s: float = 15.0, batch1k_records: int = 4_000_000,
        temp_root: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scenario in scenarios:
        if scenario == "produce_send":
            print(f"profiling {scenario} ...", flush=True)
            out[scenario] = _produce(scenario, "send", send_records, {"batch_size": 1024 * KB, "linger_ms": 5}, rate,
                                     temp_root=temp_root)
        elif scenario == "produce_batch":
            print(f"profiling {scenario} ...", flush=True)
            out[scenario] = _produce(scenario, "batch", batch_records, {"batch_size": 1024 * KB, "linger_ms": 5}, rate,
                                     temp_root=temp_root)
        elif scenario == "produce_batch1k":
            print(f"profiling {scenario} ...", flush=True)
            out[scenario] = _produce(scenario, "batch", batch1k_records, {"batch_size": 1024 * KB, "linger_ms": 5}, rate,
                                     record_size=1024, temp_root=temp_root)
        elif scenario == "latency":
            print(f"profiling {scenario} ...", flush=True)
            out[scenario] = _latency(rate, latency_s)
    consume = [s for s in scenarios if s.startswith("consume")]
    if consume:
        print(f"profiling {', '.join(consume)} ...", flush=True)
        out.update(_consume(consume_records, rate, consume))
    return {"config": {"rate_hz": rate, "send_records": send_records, "batch_records": batch_records,
                       "produce_data_dir_root": temp_root or tempfile.gettempdir(),
                       "batch1k_records": batch1k_records,
                       "consume_records": consume_records, "latency_s": latency_s}, "scenarios": out}


def show(result: dict[str, Any], top: int = 8) -> None:
    for scenario, data in result["scenarios"].items():
        work = data["workload"]
        headline = {k: work.get(k) for k in ("records_per_s", "mb_per_s", "achieved_rate") if k in work}
        print(f"\n== {scenario}: {headline}")
        for process, prof in data["profiles"].items():
            if "self" not in prof:
                print(f"  {process}: no profile ({prof.get('error', '?')[:200]})")
                continue
            rows = [{"self %": r["pct"], "function": r["function"], "hottest line": r["hottest_line"].rsplit(" (", 1)[-1][:-1],
                     "line %": r["hottest_line_pct"]} for r in prof["self"][:top]]
            harness.print_table(f"{scenario} / {process}: {prof['samples']} work samples (+{prof['loop_pct']}% event-loop "
                                f"line, {prof['wait_pct']}% waits), ~{prof['approx_cores_busy']} cores, threads "
                                f"{prof['threads']}", rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="*", choices=SCENARIOS, default=SCENARIOS)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--send-records", type=int, default=4_000_000)
    parser.add_argument("--batch-records", type=int, default=40_000_000)
    parser.add_argument("--batch1k-records", type=int, default=4_000_000)
    parser.add_argument("--consume-records", type=int, default=15_000_000)
    parser.add_argument("--latency-s", type=float, default=15.0)
    parser.add_argument("--tmpfs", action="store_true",
                        help="produce scenarios: broker data in /dev/shm (no page-cache writeback throttling), so the "
                             "profile shows CPU hot spots rather than the disk; results go to profile-tmpfs.json")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.scenarios, args.rate, args.send_records, args.batch_records, args.consume_records, args.latency_s,
                 args.batch1k_records, "/dev/shm" if args.tmpfs else None)
    show(result)
    print("wrote", harness.write_results("profile-tmpfs" if args.tmpfs else "profile", result))
    return result


if __name__ == "__main__":
    main()
