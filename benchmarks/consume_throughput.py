"""Consumer throughput: `poll_arrow()` and per-record `poll()`, on both broker event loops.

One broker process, one consumer process. The topic is loaded once (100-byte values through
`send_batch`), then the broker is restarted on the same data directory with
`-o event.loop=uvloop` (the default) and with `-o event.loop=asyncio`, and every consume mode runs
against each: the comparison of the two loops is rerun with `--loops uvloop asyncio`. Both send
fetch ranges with sendfile (`zero.copy`). The page cache is warm for all runs (the data was just written and is
re-read by every run), so this measures the broker and client, not the disk.

The clock starts just before `assign()` (so prefetching cannot start early) and stops at the
poll that returned the last record. Consumer: auto_offset_reset=earliest (assign positions at the
log start), other settings at their defaults unless given with --consumer-config.

Loop lag: while the consumer runs, a second connection sends a Metadata request every 10 ms
(`LagProbe`, in the harness process) and records each round trip. A broker that does slow work on
its event loop (a read of a large range, say) answers it late; the p99 and max of those round trips
are the `lag_*_ms` columns.

Modes:
- arrow:      poll_arrow(timeout_ms=100) -> pyarrow.Table; value bytes summed from the offsets buffer
- records:    poll(timeout_ms=100) -> list[ConsumerRecord]; the loop touches every record (len(value))
- records500: poll(timeout_ms=100, max_records=500) (Kafka's max.poll.records default)

    python -m benchmarks.consume_throughput [--records N] [--quick] [--loops uvloop asyncio] [--repeat 2]
"""
from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

import protocol
from benchmarks import harness
from benchmarks.harness import KB, MB, SummaryRow

DEFAULT_RECORDS = 5_000_000
RECORD_SIZE = 100
MODES = {"arrow": None, "records": None, "records500": 500}
TARGETS = {"arrow": 2_000_000, "records": 1_000_000}


def consume_worker(bootstrap: str, topic: str, partitions: int, expected: int, mode: str, max_records: int | None,
                   broker_pid: int | None = None, idle_timeout_s: float = 10.0,
                   consumer_config: dict[str, Any] | None = None, ready: Any = None, go: Any = None) -> dict[str, Any]:
    """Runs in the consumer process: read `expected` records from the beginning of every partition."""
    from client import Consumer

    harness.warm_up_arrow()
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", **(consumer_config or {}))
    try:
        if ready is not None:
            ready.set()
        if go is not None:
            go.wait()
        meter = harness.WindowMeter("consumer", broker_pid).start()
        t0 = time.perf_counter()
        consumer.assign([(topic, p) for p in range(partitions)])
        count = size = polls = 0
        first = last = None
        idle_since = time.perf_counter()
        while count < expected:
            if mode == "arrow":
                table = consumer.poll_arrow(timeout_ms=100, max_records=max_records)
                n = table.num_rows
                if n:
                    size += _value_bytes(table)
            else:
                records = consumer.poll(timeout_ms=100, max_records=max_records)
                n = len(records)
                for r in records:
                    size += len(r.value)
            polls += 1
            now = time.perf_counter()
            if n:
                count += n
                first = first if first is not None else now
                last = idle_since = now
            elif now - idle_since > idle_timeout_s:
                break
        cpu = meter.stop((last - t0) if last is not None else time.perf_counter() - t0)
    finally:
        consumer.close()
    elapsed = (last - t0) if last is not None else 0.0
    out: dict[str, Any] = {
        "records": count, "expected": expected, "stalled": count < expected, "polls": polls,
        "elapsed_s": round(elapsed, 3), "records_per_s": round(count / elapsed, 1) if elapsed else 0.0,
        "mb_per_s": round(size / elapsed / MB, 1) if elapsed else 0.0,
        "first_record_ms": round((first - t0) * 1000, 1) if first is not None else None, **cpu,
    }
    return out


def _value_bytes(table: Any) -> int:
    """Bytes of the value column from its offsets (cheaper than a compute kernel: the benchmark
    should not add per-poll work the consumer itself does not do)."""
    import numpy as np

    total = 0
    for chunk in table.column("value").chunks:
        if len(chunk):
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=len(chunk) + 1, offset=4 * chunk.offset)
            total += int(offsets[-1] - offsets[0])
    return total


def load_worker(bootstrap: str, topic: str, records: int, record_size: int, batch_size: int) -> dict[str, Any]:
    """Fill the topic with `records` values through send_batch (producer process)."""
    from benchmarks.produce_throughput import produce_worker

    return produce_worker(bootstrap, topic, "batch", records, record_size,
                          {"acks": 1, "batch_size": batch_size, "linger_ms": 5, "max_in_flight": 5}, warmup_records=0)


class LagProbe:
    """Round trips of a Metadata request sent every `interval_s` on its own connection (a thread of
    the harness process): how late the broker's event loop answers while it serves the consumer."""

    def __init__(self, bootstrap: str, interval_s: float = 0.010) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.address = (host, int(port))
        self.interval_s = interval_s
        self.round_trips_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-probe", daemon=True)

    def start(self) -> "LagProbe":
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop and return the round trips' percentiles (`lag_p50_ms`, `lag_p99_ms`, `lag_max_ms`)."""
        self._stop.set()
        self._thread.join(10)
        stats = harness.percentiles(self.round_trips_ms)
        return {f"lag_{k}": v for k, v in stats.items() if k in ("p50_ms", "p99_ms", "max_ms")}

    def _run(self) -> None:
        decoder = protocol.ResponseDecoder(1 << 24)
        with socket.create_connection(self.address, timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            correlation_id = 0
            while not self._stop.wait(self.interval_s):
                correlation_id += 1
                t0 = time.perf_counter()
                sock.sendall(protocol.encode_request(protocol.ApiKey.METADATA, 0, correlation_id, {"topics": []}))
                answered: list[int] = []
                while correlation_id not in answered:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        return  # the broker stopped
                    answered += [r.correlation_id for r in decoder.feed(chunk)]
                self.round_trips_ms.append((time.perf_counter() - t0) * 1000)


def run_consumer(broker: harness.BrokerProcess, topic: str, partitions: int, expected: int, mode: str,
                 consumer_config: dict[str, Any] | None = None, idle_timeout_s: float = 10.0,
                 profiler: harness.Profiler | None = None) -> dict[str, Any]:
    ready, go = harness.new_event(), harness.new_event()
    worker = harness.Worker(consume_worker, name=f"consumer-{mode}", bootstrap=broker.bootstrap, topic=topic,
                            partitions=partitions, expected=expected, mode="arrow" if mode == "arrow" else "records",
                            max_records=MODES[mode], broker_pid=broker.pid, idle_timeout_s=idle_timeout_s,
                            consumer_config=consumer_config, ready=ready, go=go).start()
    if not ready.wait(120):
        worker.kill()
        raise RuntimeError("consumer did not get ready")
    harness.wait_for_quiet()
    probe = LagProbe(broker.bootstrap).start()
    go.set()
    if profiler is not None:
        profiler.attach("consumer", worker.pid)
        profiler.attach("broker", broker.pid)
    try:
        result = worker.result(timeout_s=1800)
    finally:
        lag = probe.stop()
    result.update(lag)
    if profiler is not None:
        result["profile"] = profiler.stop()
    return result


def load_topic(broker: harness.BrokerProcess, topic: str, partitions: int, records: int,
               batch_size: int = 256 * KB, record_size: int = RECORD_SIZE) -> dict[str, Any]:
    harness.create_topic(broker.bootstrap, topic, partitions)
    loaded = harness.run_worker(load_worker, name="loader", bootstrap=broker.bootstrap, topic=topic, records=records,
                                record_size=record_size, batch_size=batch_size)
    ends = harness.topic_end_offsets(broker.bootstrap, topic, partitions)
    assert sum(ends.values()) == records, (ends, records)
    return loaded


def run(records: int | None = None, quick: bool = False, partitions: int = 3, loops: list[str] | None = None,
        modes: list[str] | None = None, repeat: int = 3, load_batch_size: int = 256 * KB,
        consumer_config: dict[str, Any] | None = None) -> dict[str, Any]:
    records = records or harness.scaled(DEFAULT_RECORDS, quick)
    loops = loops or ["uvloop", "asyncio"]
    modes = modes or list(MODES)
    topic = "consume-bench"
    data_dir = harness.make_temp_dir()
    rows: list[dict[str, Any]] = []
    try:
        broker = harness.BrokerProcess(harness.broker_overrides("uvloop"), data_dir=data_dir).start()
        try:
            loaded = load_topic(broker, topic, partitions, records, load_batch_size)
            print(f"  loaded {records:,} records of {RECORD_SIZE} B at {loaded['records_per_s']:,.0f} msg/s", flush=True)
        finally:
            broker.stop()
        disk = harness.dir_size_bytes(data_dir)
        for loop in loops:
            broker = harness.BrokerProcess(harness.broker_overrides(loop), data_dir=data_dir, name=f"broker-{loop}").start()
            try:
                for mode in modes:
                    for rep in range(repeat):
                        result = run_consumer(broker, topic, partitions, records, mode, consumer_config,
                                              idle_timeout_s=5.0 if mode == "records500" else 10.0)
                        row = {"event_loop": loop, "mode": mode, "run": rep + 1, **result}
                        rows.append(row)
                        print(f"  {loop:7s} {mode:10s} run {rep + 1}: {row['records_per_s']:>12,.0f} msg/s "
                              f"{row['mb_per_s']:>7,.1f} MB/s  loop lag p99 {row.get('lag_p99_ms')} ms max {row.get('lag_max_ms')} ms  (consumer cpu {row['consumer_cpu_pct']}%, broker cpu "
                              f"{row.get('broker_cpu_pct', '?')}%, other {row.get('other_cpu_pct', '?')}%){'  STALLED at %d' % row['records'] if row['stalled'] else ''}",
                              flush=True)
            finally:
                broker.stop()
    finally:
        harness.remove_temp_dir(data_dir)
    return {"config": {"records": records, "record_size": RECORD_SIZE, "partitions": partitions, "repeat": repeat,
                       "load_batch_size": load_batch_size, "consumer_config": consumer_config or {},
                       "topic_bytes_on_disk": disk, "quick": quick}, "rows": rows}


def best(rows: list[dict[str, Any]], mode: str, loop: str | None = None) -> dict[str, Any] | None:
    """The median run of `mode` on `loop` (a stalled run counts as 0 msg/s), or with no loop given
    the better of the event loops' medians. Adds `runs_per_s` (every run's rate)."""
    if loop is None:
        medians = [m for lp in dict.fromkeys(r["event_loop"] for r in rows) if (m := best(rows, mode, lp)) is not None]
        return max(medians, key=lambda r: r["records_per_s"], default=None)
    runs = sorted((r for r in rows if r["mode"] == mode and r["event_loop"] == loop),
                  key=lambda r: 0 if r["stalled"] else r["records_per_s"])
    if not runs:
        return None
    median = dict(runs[(len(runs) - 1) // 2])
    median["runs_per_s"] = [r["records_per_s"] for r in rows if r["mode"] == mode and r["event_loop"] == loop]
    return median


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    rows = result["rows"]
    out = []
    for mode, label, target in (("arrow", "consume, `poll_arrow()`", TARGETS["arrow"]),
                                ("records", "consume, per-record `poll()`", TARGETS["records"])):
        r = best(rows, mode)
        if r is None:
            continue
        per_loop = "; ".join(f"{loop}: {harness.rate(b['records_per_s'])}" for loop in ("uvloop", "asyncio")
                             if (b := best(rows, mode, loop)) is not None)
        runs = ", ".join(harness.rate(x).replace(" msg/s", "") for x in r["runs_per_s"])
        out.append(SummaryRow(label, f">= {target:,} msg/s", harness.rate(r["records_per_s"]), r["records_per_s"] >= target,
                              f"median of {len(r['runs_per_s'])} runs ({runs}) on the faster broker, {r['event_loop']} "
                              f"(medians: {per_loop}); {r['records']:,} x 100 B records; "
                              f"cpu consumer {r['consumer_cpu_pct']}% / broker {r.get('broker_cpu_pct', '?')}% / rest of machine "
                              f"{r.get('other_cpu_pct', '?')}%"))
    stalled = [r for r in rows if r["mode"] == "records500" and r["stalled"]]
    r500 = best(rows, "records500")
    if r500 is not None and r500["stalled"]:
        r500 = None
    if stalled or r500:
        if stalled:
            measured = f"stalls after {max(r['records'] for r in stalled):,} records"
            note = ("poll(max_records=500) never finishes: poll_arrow does not subtract the bytes of the part it takes "
                    "when it splits a buffered batch, so _buffered_bytes only grows and the fetchers stop at max_buffer_bytes")
        else:
            measured, note = harness.rate(r500["records_per_s"]), "Kafka's default max.poll.records"
        out.append(SummaryRow("consume, `poll(max_records=500)`", "(no target)", measured, None, note))
    ua, aa = best(rows, "arrow", "uvloop"), best(rows, "arrow", "asyncio")
    if ua and aa:
        faster, slower = (ua, aa) if ua["records_per_s"] >= aa["records_per_s"] else (aa, ua)
        ratio = faster["records_per_s"] / max(slower["records_per_s"], 1)
        ur, ar = best(rows, "records", "uvloop"), best(rows, "records", "asyncio")
        per_record = (f"; poll(): uvloop {harness.rate(ur['records_per_s'])}, asyncio {harness.rate(ar['records_per_s'])}"
                      if ur and ar else "")
        verdict = (f"{faster['event_loop']} faster by {ratio:.2f}x" if ratio >= 1.05 else
                   f"a tie: {faster['event_loop']} ahead by {100 * (ratio - 1):.0f}%")
        out.append(SummaryRow("broker event loop for fetch", "(comparison)", verdict,
                              None, f"poll_arrow medians: uvloop {harness.rate(ua['records_per_s'])}, "
                                    f"asyncio {harness.rate(aa['records_per_s'])}; broker cpu "
                                    f"{ua.get('broker_cpu_pct', '?')}% vs {aa.get('broker_cpu_pct', '?')}% of a core; "
                                    f"loop lag p99 {ua.get('lag_p99_ms', '?')} ms vs {aa.get('lag_p99_ms', '?')} ms"
                                    f"{per_record}; the consumer process (~80-100% of a core) is the bottleneck either way"))
    return out


COLUMNS = ["event_loop", "mode", "run", "records", "elapsed_s", "records_per_s", "mb_per_s",
           "first_record_ms", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "consumer_cpu_pct", "broker_cpu_pct", "other_cpu_pct", "stalled"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.consume_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=None, help=f"records to load and read [{DEFAULT_RECORDS:,}]")
    parser.add_argument("--quick", action="store_true", help="~20x fewer records")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--loops", nargs="*", choices=["uvloop", "asyncio"], default=None)
    parser.add_argument("--modes", nargs="*", choices=list(MODES), default=None)
    parser.add_argument("--repeat", type=int, default=3, help="runs per (event loop, mode); the best is reported")
    parser.add_argument("--load-batch-size", type=int, default=256 * KB, help="producer batch_size used to load the topic")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.records, args.quick, args.partitions, args.loops, args.modes, args.repeat, args.load_batch_size)
    harness.print_table("consume throughput", result["rows"], COLUMNS)
    rows = summary(result)
    harness.print_table("consume throughput vs targets", [r.as_dict() for r in rows])
    result["summary"] = [r.as_dict() for r in rows]
    print("wrote", harness.write_results("consume_throughput", result))
    return result


if __name__ == "__main__":
    main()
