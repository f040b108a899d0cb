"""Producer ingest throughput: `send_batch()` (columnar) and per-record `send()`, acks=1.

One broker process, one producer process. Each configuration gets a fresh topic (deleted after
the run). The producer first sends a warm-up (connections, Arrow's tz database, code paths), then
the clock runs from the first timed send to the end of `flush()` (every record acknowledged).

    python -m benchmarks.produce_throughput                 # the default sweep (see SWEEPS)
    python -m benchmarks.produce_throughput --quick         # ~20x smaller volumes
    python -m benchmarks.produce_throughput --only send100 --records 2000000

Workloads (null keys, so the sticky partitioner spreads batches over the partitions):
- batch100: 100-byte values through `Producer.send_batch` (Arrow tables of `--rows-per-call` rows)
- send100:  100-byte values through `Producer.send`, one call per record
- batch1k:  1 KiB values through `Producer.send_batch`
- batch100_sustained: batch100's usual best config with 8x the volume (~5 GB written)
- checked_{cb,futures}{100,1k}_p{1,3}: per-record `send()` of 100 B or 1 KiB values with every
  record's outcome checked by the application, by an on_delivery callback (cb) or by keeping every
  future and asking each after `flush()` (futures; inside the timed part), on 1 or 3 partitions
Each configuration runs REPEAT times on the same broker; the summary takes the configuration with
the best median run. The producer warms up with 200,000 records first (connections, code paths and
the broker's allocator: the very first run on a fresh broker is up to 2x slower).
During each timed run a client times a Metadata request every 10 ms (benchmarks/loop_lag.py's
Pinger): its p99 and worst latency are the event loop's lag as a client sees it.
For `send_batch` the harness bounds unacknowledged bytes to `buffer_memory` itself: send_batch
does not block on buffer_memory (it queues everything it is given).

MB is 2**20 bytes of record values.
"""
from __future__ import annotations

import argparse
import time
from collections import deque
from operator import methodcaller
from typing import Any, Callable

from benchmarks import harness
from benchmarks.harness import KB, MB, SummaryRow
from benchmarks.loop_lag import Pinger

# name -> (mode, record_size, default records, list of producer configs)
SWEEPS: dict[str, tuple[str, int, int, list[dict[str, Any]]]] = {
    "batch100": ("batch", 100, 5_000_000, [
        {"batch_size": 256 * KB, "linger_ms": 5},
        {"batch_size": 512 * KB, "linger_ms": 5},
        {"batch_size": 1024 * KB, "linger_ms": 5},
    ]),
    "send100": ("send", 100, 5_000_000, [
        {"batch_size": 256 * KB, "linger_ms": 5},
        {"batch_size": 256 * KB, "linger_ms": 20},
        {"batch_size": 1024 * KB, "linger_ms": 5},
        {"batch_size": 1024 * KB, "linger_ms": 20},
    ]),
    "batch1k": ("batch", 1024, 1_000_000, [
        {"batch_size": 256 * KB, "linger_ms": 5},
        {"batch_size": 1024 * KB, "linger_ms": 5},
    ]),
    # Sustained: 8x the volume (~5 GB on disk), once, with the usual best config. The short runs
    # above mostly land in the page cache and in a warmed-up allocator; this one shows the rate the
    # broker keeps up (its event-loop thread saturates).
    "batch100_sustained": ("batch", 100, 40_000_000, [
        {"batch_size": 512 * KB, "linger_ms": 5},
    ]),
    # Per-record send() as applications write it: every record's outcome checked, by an
    # on_delivery callback (send_cb) or by keeping each future and asking it after flush
    # (send_futures); on 1 and on 3 partitions (issue 7's targets: >= 600k msg/s of 100 B on one
    # partition, no more than 10 % less on three).
    **{f"checked_{style}{label}_p{parts}": (f"send_{style}", size, count, [{"batch_size": 1024 * KB, "linger_ms": 5}])
       for style in ("cb", "futures") for label, size, count in (("100", 100, 2_000_000), ("1k", 1024, 500_000))
       for parts in (1, 3)},
}
REPEAT = {"batch100": 3, "send100": 2, "batch1k": 3, "batch100_sustained": 1}
PARTITIONS = {name: int(name[-1]) for name in SWEEPS if name.startswith("checked_")}  # else --partitions
CHECKED_TARGET = 600_000
BASE_CONFIG = {"acks": 1, "max_in_flight": 5, "compression": "none", "buffer_memory": 64 * MB}
TARGETS = {"batch100": 1_000_000, "send100": 500_000, "batch1k_mb": 400}


# -- the producer process ----------------------------------------------------------------------


def produce_worker(bootstrap: str, topic: str, mode: str, records: int, record_size: int, config: dict[str, Any],
                   broker_pid: int | None = None, rows_per_call: int | None = None,
                   warmup_records: int = 200_000, ready: Any = None, go: Any = None) -> dict[str, Any]:
    """Runs in the producer process. Returns throughput and CPU use of this process and the broker."""
    from client import Producer

    harness.warm_up_arrow()
    rows = rows_per_call or max(1, min(65_536, (4 * MB) // max(record_size, 1)))
    limit = config.get("buffer_memory", 64 * MB)
    if mode == "batch":
        buffer = harness.payload_buffer(record_size, rows)
        tables = [harness.value_table(buffer, record_size, rows, v) for v in range(8)]
    else:
        values = harness.value_list(record_size, 1024)
    with Producer(bootstrap, **config) as producer:
        # Warm-up: not timed.
        if mode == "batch":
            _send_tables(producer, topic, max(warmup_records, rows) if warmup_records else 0, rows, tables, limit)
            producer.flush()
        else:
            check = _send_records(producer, topic, warmup_records, values, mode)
            producer.flush()
            check()
        if ready is not None:
            ready.set()
        if go is not None:
            go.wait()
        meter = harness.WindowMeter("producer", broker_pid).start()
        t0 = time.perf_counter()
        verify: Callable[[], None] = lambda: None
        if mode == "batch":
            _send_tables(producer, topic, records, rows, tables, limit)
        else:
            verify = _send_records(producer, topic, records, values, mode)
        t_sent = time.perf_counter()
        producer.flush()
        verify()
        elapsed = time.perf_counter() - t0
        cpu = meter.stop(elapsed)
    out = {
        "records": records, "record_size": record_size, "elapsed_s": round(elapsed, 3),
        "records_per_s": round(records / elapsed, 1), "mb_per_s": round(records * record_size / elapsed / MB, 1),
        "send_loop_s": round(t_sent - t0, 3), "rows_per_call": rows if mode == "batch" else 1, **cpu,
    }
    return out


def _send_records(producer: Any, topic: str, count: int, values: list[bytes], mode: str) -> Callable[[], None]:
    """Per-record send(); returns the application's check of every outcome, to run once flushed
    (mode send_cb: an on_delivery callback counted them; send_futures: each kept future is asked;
    send: nothing is checked)."""
    send = producer.send
    if mode == "send_cb":
        outcomes: list[Any] = [0, None]  # acknowledged, first error (written by the I/O thread only)

        def on_delivery(metadata: Any, error: BaseException | None) -> None:
            if error is None:
                outcomes[0] += 1
            elif outcomes[1] is None:
                outcomes[1] = error

        for i in range(count):
            send(topic, values[i & 1023], on_delivery=on_delivery)

        def verify_callbacks() -> None:
            if outcomes[1] is not None:
                raise outcomes[1]
            if outcomes[0] != count:
                raise RuntimeError(f"{outcomes[0]} of {count} records acknowledged")
        return verify_callbacks
    if mode == "send_futures":
        futures = [send(topic, values[i & 1023]) for i in range(count)]

        def verify_futures() -> None:
            # exception(0): after flush() every future must be complete; one that is not raises
            # TimeoutError here instead of waiting.
            errors = list(map(_exception_now, futures))
            acknowledged = errors.count(None)
            if acknowledged != count:
                raise next((e for e in errors if e is not None), RuntimeError(f"{acknowledged} of {count} futures"))
        return verify_futures
    for i in range(count):
        send(topic, values[i & 1023])
    return lambda: None


_exception_now = methodcaller("exception", 0)


def _send_tables(producer: Any, topic: str, count: int, rows: int, tables: list[Any], limit: int) -> None:
    """send_batch in chunks of `rows`; waits for the oldest call's batches when more than
    `limit` bytes are unacknowledged (send_batch itself never blocks)."""
    outstanding: deque[tuple[list[Any], int]] = deque()
    in_flight = 0
    sent = 0
    i = 0
    while sent < count:
        n = min(rows, count - sent)
        table = tables[i % len(tables)]
        if n < rows:
            table = table.slice(0, n)
        results = producer.send_batch(topic, table)
        size = table.nbytes
        outstanding.append((results, size))
        in_flight += size
        while in_flight > limit and outstanding:
            oldest, oldest_size = outstanding.popleft()
            for result in oldest:
                result.wait(120)
                if result.error is not None:
                    raise result.error
            in_flight -= oldest_size
        sent += n
        i += 1
    for results, _ in outstanding:
        for result in results:
            if result.done() and result.error is not None:
                raise result.error


# -- the harness side --------------------------------------------------------------------------


def run_one(broker: harness.BrokerProcess, name: str, mode: str, record_size: int, records: int,
            config: dict[str, Any], partitions: int, rows_per_call: int | None = None,
            profiler: harness.Profiler | None = None) -> dict[str, Any]:
    topic = f"{name}-{int(time.time() * 1000) % 10_000_000}"
    harness.create_topic(broker.bootstrap, topic, partitions)
    full_config = {**BASE_CONFIG, **config}
    try:
        ready, go = harness.new_event(), harness.new_event()
        worker = harness.Worker(produce_worker, name=f"producer-{name}", bootstrap=broker.bootstrap, topic=topic,
                                mode=mode, records=records, record_size=record_size, config=full_config,
                                broker_pid=broker.pid, rows_per_call=rows_per_call, ready=ready, go=go).start()
        deadline = time.monotonic() + 120
        while not ready.wait(0.5):
            if not worker.process.is_alive():
                worker.result(timeout_s=5)  # raises the producer's error
            if time.monotonic() > deadline:
                worker.kill()
                raise RuntimeError("producer did not get ready")
        harness.wait_for_quiet()
        go.set()
        if profiler is not None:
            profiler.attach("producer", worker.pid)
            profiler.attach("broker", broker.pid)
        pinger = Pinger(broker.bootstrap, create_topics=False).start()  # the loop's lag, seen by a client
        try:
            result = worker.result(timeout_s=1800)
        finally:
            pinger.stop()
        lag = harness.percentiles(pinger.metadata_ms)
        result.update(metadata_p99_ms=lag.get("p99_ms"), metadata_max_ms=lag.get("max_ms"))
        profile = profiler.stop() if profiler is not None else None
    finally:
        harness.delete_topic(broker.bootstrap, topic)
    row = {"workload": name, "mode": mode, "partitions": partitions, **{k: full_config[k] for k in ("batch_size", "linger_ms", "max_in_flight",
                                                                          "compression")}, **result}
    row["batch_size_bytes"] = full_config["batch_size"]
    row["batch_size"] = f"{full_config['batch_size'] // KB}K"
    if profile is not None:
        row["profile"] = profile
    return row


def run(quick: bool = False, only: list[str] | None = None, records: int | None = None, partitions: int = 3,
        event_loop: str = "uvloop", lz4: bool = True, rows_per_call: int | None = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    broker = harness.BrokerProcess(harness.broker_overrides(event_loop)).start()
    try:
        for name, (mode, size, default_records, configs) in SWEEPS.items():
            if only and name not in only:
                continue
            n = records or harness.scaled(default_records, quick)
            repeat = 1 if quick else REPEAT.get(name, 2)
            best: dict[str, Any] | None = None
            for config in configs:
                runs = []
                for rep in range(repeat):
                    row = run_one(broker, name, mode, size, n, config, PARTITIONS.get(name, partitions), rows_per_call)
                    row["run"] = rep + 1
                    _show_progress(row)
                    rows.append(row)
                    runs.append(row)
                median = _median_row(runs)
                if best is None or median["records_per_s"] > best["records_per_s"]:
                    best = median
            if lz4 and best is not None and name in ("batch100", "send100", "batch1k"):
                config = {"batch_size": best["batch_size_bytes"], "linger_ms": best["linger_ms"]}
                for rep in range(repeat):
                    row = run_one(broker, name, mode, size, n, {**config, "compression": "lz4"}, partitions, rows_per_call)
                    row["run"] = rep + 1
                    _show_progress(row)
                    rows.append(row)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    return {"config": {"quick": quick, "partitions": partitions, "event_loop": event_loop, "acks": 1,
                       "base_producer_config": BASE_CONFIG}, "rows": rows}


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def _show_progress(row: dict[str, Any]) -> None:
    print(f"  {row['workload']:18s} batch_size={row['batch_size']:>5s} linger={row['linger_ms']:>3d} "
          f"compression={row['compression']:4s}: {row['records_per_s']:>12,.0f} msg/s {row['mb_per_s']:>8,.1f} MB/s "
          f"(cpu: producer {row['producer_cpu_pct']}%, broker {row.get('broker_cpu_pct', '?')}%, "
          f"other processes {row.get('other_cpu_pct', '?')}%; Metadata every 10 ms: p99 {row['metadata_p99_ms']} ms, "
          f"worst {row['metadata_max_ms']} ms)", flush=True)


def best_row(rows: list[dict[str, Any]], workload: str, compression: str = "none") -> dict[str, Any] | None:
    """The config with the best median run; returns that median run (with `runs_per_s`, all its runs' rates)."""
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["workload"] == workload and r["compression"] == compression:
            by_config.setdefault((r["batch_size"], r["linger_ms"], r["max_in_flight"]), []).append(r)
    medians = []
    for runs in by_config.values():
        median = dict(_median_row(runs))
        median["runs_per_s"] = [r["records_per_s"] for r in runs]
        medians.append(median)
    return max(medians, key=lambda r: r["records_per_s"], default=None)


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    rows = result["rows"]
    out = []

    def lz4_note(workload: str) -> str:
        lz = best_row(rows, workload, "lz4")
        return f"; lz4: {harness.rate(lz['records_per_s'])}, {lz['mb_per_s']:.0f} MB/s" if lz else ""

    def cfg(r: dict[str, Any]) -> str:
        configs = {(x["batch_size"], x["linger_ms"]) for x in rows if x["workload"] == r["workload"] and x["compression"] == "none"}
        runs = ", ".join(harness.rate(x).replace(" msg/s", "") for x in r["runs_per_s"])
        return (f"median of {len(r['runs_per_s'])} run(s) ({runs}) of the best of {len(configs)} configs: "
                f"batch_size {r['batch_size']}, linger {r['linger_ms']} ms, max_in_flight {r['max_in_flight']}; "
                f"{r['records']:,} records; cpu producer {r['producer_cpu_pct']}% / broker {r.get('broker_cpu_pct', '?')}% / "
                f"rest of machine {r.get('other_cpu_pct', '?')}%")

    r = best_row(rows, "batch100")
    if r:
        out.append(SummaryRow("ingest, `send_batch()`, 100 B values", ">= 1,000,000 msg/s", harness.rate(r["records_per_s"]),
                              r["records_per_s"] >= TARGETS["batch100"], cfg(r) + lz4_note("batch100")))
    r = best_row(rows, "send100")
    if r:
        out.append(SummaryRow("ingest, per-record `send()`, 100 B values", ">= 500,000 msg/s", harness.rate(r["records_per_s"]),
                              r["records_per_s"] >= TARGETS["send100"], cfg(r) + lz4_note("send100")))
    r = best_row(rows, "batch100_sustained")
    if r:
        out.append(SummaryRow("ingest, `send_batch()`, 100 B values, sustained", "(>= 1,000,000 msg/s)",
                              harness.rate(r["records_per_s"]), r["records_per_s"] >= TARGETS["batch100"], cfg(r)))
    r = best_row(rows, "batch1k")
    if r:
        out.append(SummaryRow("ingest, `send_batch()`, 1 KiB values", ">= 400 MB/s", f"{r['mb_per_s']:.0f} MB/s "
                              f"({harness.rate(r['records_per_s'])})", r["mb_per_s"] >= TARGETS["batch1k_mb"],
                              cfg(r) + lz4_note("batch1k")))
    out += _checked_summary(rows)
    return out


def _checked_summary(rows: list[dict[str, Any]]) -> list[SummaryRow]:
    """The checked per-record modes: 100 B by callback on one partition against the target,
    three partitions against 90 % of it, the rest reported."""
    out = []
    one = best_row(rows, "checked_cb100_p1")
    for name in (n for n in SWEEPS if n.startswith("checked_")):
        r = best_row(rows, name)
        if r is None:
            continue
        style = "on_delivery callback" if "_cb" in name else "futures kept, each asked after flush()"
        label = f"per-record `send()`, every outcome checked ({style}), {r['record_size']} B, {r['partitions']} partition(s)"
        runs = ", ".join(harness.rate(x).replace(" msg/s", "") for x in r["runs_per_s"])
        note = (f"median of {len(r['runs_per_s'])} runs ({runs}); {r['records']:,} records, batch_size {r['batch_size']}, "
                f"linger {r['linger_ms']} ms; cpu producer {r['producer_cpu_pct']}% / broker {r.get('broker_cpu_pct', '?')}%"
                f" / rest of machine {r.get('other_cpu_pct', '?')}%")
        if name == "checked_cb100_p1":
            out.append(SummaryRow(label, f">= {CHECKED_TARGET:,} msg/s", harness.rate(r["records_per_s"]),
                                  r["records_per_s"] >= CHECKED_TARGET, note))
        elif name == "checked_cb100_p3" and one is not None:
            ratio = r["records_per_s"] / one["records_per_s"]
            out.append(SummaryRow(label, ">= 90 % of 1 partition", f"{harness.rate(r['records_per_s'])} ({ratio:.0%})",
                                  ratio >= 0.9 and r["records_per_s"] >= 0.9 * CHECKED_TARGET, note))
        else:
            out.append(SummaryRow(label, "(report)", harness.rate(r["records_per_s"]), None, note))
    return out


COLUMNS = ["workload", "partitions", "batch_size", "linger_ms", "max_in_flight", "compression", "run", "records", "elapsed_s",
           "records_per_s", "mb_per_s", "producer_cpu_pct", "broker_cpu_pct", "other_cpu_pct", "metadata_p99_ms",
           "metadata_max_ms"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.produce_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes")
    parser.add_argument("--only", nargs="*", choices=list(SWEEPS), help="run only these workloads")
    parser.add_argument("--records", type=int, default=None, help="records per run (overrides the workload default)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--event-loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--rows-per-call", type=int, default=None, help="rows per send_batch call [~4 MiB of values]")
    parser.add_argument("--no-lz4", action="store_true", help="skip the lz4 run with the best config")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.quick, args.only, args.records, args.partitions, args.event_loop, not args.no_lz4, args.rows_per_call)
    harness.print_table("produce throughput (acks=1)", result["rows"], COLUMNS)
    rows = summary(result)
    harness.print_table("produce throughput vs targets", [r.as_dict() for r in rows])
    result["summary"] = [r.as_dict() for r in rows]
    print("wrote", harness.write_results("produce_throughput", result))
    return result


if __name__ == "__main__":
    main()
