"""Latency as an application sees it: produce -> ack and produce -> consume, stage by stage.

One broker process, one producer process and one consumer process on this machine (they share its
clock, so `time.time_ns()` stamps compare across processes). The producer sends 100-byte values
with the synchronous `Producer`'s per-record `send()` at a fixed rate (acks=1, one partition),
carrying the send time in the first 8 bytes of each value; each record's outcome comes back
through `on_delivery`. The consumer is the synchronous `Consumer` with its default settings,
tailing the partition with per-record `poll()`.

Per record, joined by offset:

| stage | from | to |
| --- | --- | --- |
| `send->written` | just before `send()` | its Produce request was written to the socket (linger, batching, the hop to the I/O thread) |
| `written->acked` | request written | `on_delivery` called (broker append, network, reply handling) |
| `written->fetched` | request written | the consumer's I/O thread has the fetch response holding it (append, fetch wake-up, network) |
| `fetched->polled` | fetch response handled | `poll()` returned it on the application thread (decode, hand-off) |
| `ack` | just before `send()` | `on_delivery` |
| `e2e` | just before `send()` | right after `poll()` returned it: the figure the issue's targets are for |

The write and fetch stamps come from benchmark-only wrappers around `Sender._launch` (which
writes the request before returning) and `Fetcher._absorb` (the fetch response's data,
stamped on entry), installed in the client processes only. The first `--warmup-s` seconds of
records are left out.

    python -m benchmarks.latency [--rates 1000 10000 50000] [--lingers 0 1] [--duration-s 10] [--repeat 1]
                                 [--topic-config flush.messages=1]
"""
from __future__ import annotations

import argparse
import statistics
import struct
import time
from typing import Any

from benchmarks import harness
from benchmarks.harness import SummaryRow

_NS = struct.Struct("<q")
STAGES = ["send->written", "written->acked", "written->fetched", "fetched->polled", "ack", "e2e"]
TARGET_RATE = 10_000
TARGET_P50_MS, TARGET_P99_MS = 0.6, 2.0


def latency_producer(bootstrap: str, topic: str, rate: int, duration_s: float, record_size: int,
                     config: dict[str, Any], ready: Any = None, go: Any = None, broker_pid: int | None = None,
                     consumer_pid: int | None = None) -> dict[str, Any]:
    """Runs in the producer process: paced per-record send(); per record (in send order) the send,
    request-written and delivery stamps and the offset the broker gave it."""
    import numpy as np

    from client import Producer
    from client.sender import Sender

    harness.warm_up_arrow()
    pad = b"x" * max(0, record_size - 8)
    total = int(rate * duration_s)
    sent_ns = np.zeros(total, dtype=np.int64)
    acked_ns = np.zeros(total, dtype=np.int64)
    offsets = np.full(total, -1, dtype=np.int64)
    written: list[tuple[int, int]] = []  # (stamp, records in the request), in write order
    delivered = 0
    errors: list[BaseException] = []
    now_ns = time.time_ns

    def on_delivery(metadata: Any, error: BaseException | None) -> None:
        nonlocal delivered
        if error is not None:
            errors.append(error)
        else:  # one partition: deliveries come in send order
            acked_ns[delivered] = now_ns()
            offsets[delivered] = metadata.offset
        delivered += 1

    launch = Sender._launch

    def stamped_launch(self: Any, node: int, conn: Any, batches: list[Any]) -> None:
        launch(self, node, conn, batches)
        written.append((now_ns(), sum(b.record_count for b in batches)))

    with Producer(bootstrap, **config) as producer:
        producer.send(topic, _NS.pack(now_ns()) + pad).result(30)  # connection + metadata warm
        Sender._launch = stamped_launch  # type: ignore[method-assign]  # this process only
        if ready is not None:
            ready.set()
        if go is not None:
            go.wait()
        send, perf = producer.send, time.perf_counter
        meter = harness.WindowMeter("producer", broker_pid, {"consumer": consumer_pid} if consumer_pid else None).start()
        t0 = perf()
        late = 0
        for i in range(total):
            delay = t0 + i / rate - perf()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.001:
                late += 1
            ns = now_ns()
            sent_ns[i] = ns
            send(topic, _NS.pack(ns) + pad, on_delivery=on_delivery)
        elapsed = perf() - t0
        cpu = meter.stop(elapsed)
        producer.flush()
    if errors:
        raise errors[0]
    stamps = np.array([s for s, _ in written], dtype=np.int64)
    counts = np.array([c for _, c in written], dtype=np.int64)
    if counts.sum() != total:
        raise RuntimeError(f"requests carried {counts.sum()} records, {total} were sent (retries?)")
    return {"sent": total, "achieved_rate": round(total / elapsed, 1), "late_sends": late, "requests": len(written),
            "sent_ns": sent_ns, "written_ns": np.repeat(stamps, counts), "acked_ns": acked_ns, "offsets": offsets, **cpu}


def latency_consumer(bootstrap: str, topic: str, expected: int, ready: Any = None,
                     idle_timeout_s: float = 15.0) -> dict[str, Any]:
    """Runs in the consumer process: per-record poll() from the tail; per record its offset and
    the fetch-handled and poll-returned stamps."""
    import numpy as np

    from client import Consumer
    from client.fetcher import Fetcher

    harness.warm_up_arrow()
    now_ns = time.time_ns
    fetched: list[tuple[int, int, int]] = []  # (stamp, first offset, next offset)
    absorb = Fetcher._absorb

    def stamped_absorb(self: Any, tp: Any, data: Any) -> None:
        stamp, start = now_ns(), self._subs.fetch_position(tp)
        absorb(self, tp, data)
        end = self._subs.fetch_position(tp)
        if start is not None and end is not None and end > start:
            fetched.append((stamp, start, end))

    Fetcher._absorb = stamped_absorb  # type: ignore[method-assign]  # this process only
    offsets = np.zeros(expected, dtype=np.int64)
    polled_ns = np.zeros(expected, dtype=np.int64)
    count = 0
    with Consumer(bootstrap, auto_offset_reset="latest") as consumer:
        consumer.assign([(topic, 0)])
        consumer.poll(timeout_ms=200)  # the first fetch is out: the producer may start
        if ready is not None:
            ready.set()
        idle_since = time.perf_counter()
        while count < expected:
            records = consumer.poll(timeout_ms=100)
            stamp = now_ns()
            if not records:
                if time.perf_counter() - idle_since > idle_timeout_s:
                    break
                continue
            idle_since = time.perf_counter()
            for record in records:
                if count < expected:
                    offsets[count] = record.offset
                    polled_ns[count] = stamp
                    count += 1
    starts = np.array([s for _, s, _ in fetched], dtype=np.int64)
    stamps = np.array([t for t, _, _ in fetched], dtype=np.int64)
    offsets, polled_ns = offsets[:count], polled_ns[:count]
    at = np.searchsorted(starts, offsets, side="right") - 1
    return {"received": count, "expected": expected, "consumed_offsets": offsets, "polled_ns": polled_ns,
            "fetched_ns": stamps[at] if len(stamps) else np.zeros(0, dtype=np.int64), "fetches": len(fetched)}


def stage_latencies(produced: dict[str, Any], consumed: dict[str, Any], warmup: int) -> dict[str, dict[str, float]]:
    """Per-stage percentiles over the records after the warm-up, joined by offset."""
    import numpy as np

    keep = slice(warmup, None)
    sent, written, acked, offsets = (produced[k][keep] for k in ("sent_ns", "written_ns", "acked_ns", "offsets"))
    order = np.argsort(consumed["consumed_offsets"])
    c_offsets = consumed["consumed_offsets"][order]
    at = np.searchsorted(c_offsets, offsets)
    found = (at < len(c_offsets)) & (c_offsets[np.minimum(at, len(c_offsets) - 1)] == offsets)
    fetched = consumed["fetched_ns"][order][at[found]]
    polled = consumed["polled_ns"][order][at[found]]
    ms = 1e-6
    out = {"send->written": harness.percentiles((written - sent) * ms),
           "written->acked": harness.percentiles((acked - written) * ms),
           "written->fetched": harness.percentiles((fetched - written[found]) * ms),
           "fetched->polled": harness.percentiles((polled - fetched) * ms),
           "ack": harness.percentiles((acked - sent) * ms),
           "e2e": harness.percentiles((polled - sent[found]) * ms)}
    out["e2e"]["missing"] = int((~found).sum())
    return out


def run_once(rate: int, duration_s: float, warmup_s: float, linger_ms: int, record_size: int = 100,
             profiler: harness.Profiler | None = None, topic_configs: dict[str, Any] | None = None,
             event_loop: str = "uvloop") -> dict[str, Any]:
    broker = harness.BrokerProcess(harness.broker_overrides(event_loop)).start()
    try:
        topic = "latency"
        harness.create_topic(broker.bootstrap, topic, 1, topic_configs)
        total = int(rate * duration_s)
        consumer_ready = harness.new_event()
        consumer = harness.Worker(latency_consumer, name="latency-consumer", bootstrap=broker.bootstrap, topic=topic,
                                  expected=total, ready=consumer_ready).start()
        if not consumer_ready.wait(120):
            raise RuntimeError("consumer did not get ready")
        ready, go = harness.new_event(), harness.new_event()
        config = {"acks": 1, "linger_ms": linger_ms, "max_in_flight": 5, "compression": "none"}
        producer = harness.Worker(latency_producer, name="latency-producer", bootstrap=broker.bootstrap, topic=topic,
                                  rate=rate, duration_s=duration_s, record_size=record_size, config=config, ready=ready,
                                  go=go, broker_pid=broker.pid, consumer_pid=consumer.pid).start()
        if not ready.wait(120):
            raise RuntimeError("producer did not get ready")
        harness.wait_for_quiet()
        go.set()
        if profiler is not None:
            for name, pid in (("producer", producer.pid), ("consumer", consumer.pid), ("broker", broker.pid)):
                profiler.attach(name, pid)
        produced = producer.result(timeout_s=duration_s * 4 + 120)
        consumed = consumer.result(timeout_s=120)
        profile = profiler.stop() if profiler is not None else None
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    if consumed["received"] == 0:
        raise RuntimeError(f"the consumer received none of the {consumed['expected']} records "
                           f"({consumed['fetches']} fetches stamped): see the consumer process's log")
    stages = stage_latencies(produced, consumed, int(rate * warmup_s))
    scalars = {k: v for k, v in {**produced, **consumed}.items() if not hasattr(v, "dtype")}
    return {"event_loop": event_loop, "rate": rate, "duration_s": duration_s, "linger_ms": linger_ms,
            "records_per_request": round(produced["sent"] / max(1, produced["requests"]), 2),
            **scalars, "stages": stages, **({"profile": profile} if profile is not None else {})}


def run(rates: list[int], lingers: list[int], duration_s: float = 10.0, warmup_s: float = 2.0, repeat: int = 1,
        record_size: int = 100, quick: bool = False, topic_configs: dict[str, Any] | None = None) -> dict[str, Any]:
    if quick:
        duration_s, warmup_s, repeat = min(duration_s, 4.0), min(warmup_s, 1.0), 1
    rows = []
    for rate in rates:
        for linger in lingers:
            for rep in range(repeat):
                row = run_once(rate, duration_s, warmup_s, linger, record_size, topic_configs=topic_configs)
                row["run"] = rep + 1
                rows.append(row)
                e2e, ack = row["stages"]["e2e"], row["stages"]["ack"]
                print(f"  {rate:>6} msg/s linger {linger} run {rep + 1}: e2e p50 {e2e.get('p50_ms')} p99 {e2e.get('p99_ms')} "
                      f"p99.9 {e2e.get('p99_9_ms')} ms | ack p50 {ack.get('p50_ms')} p99 {ack.get('p99_ms')} ms | "
                      f"{row['records_per_request']} records/request | cpu producer {row.get('producer_cpu_pct')}% "
                      f"broker {row.get('broker_cpu_pct')}% consumer {row.get('consumer_cpu_pct')}% | rest of machine "
                      f"{row.get('other_cpu_pct')}%", flush=True)
    return {"config": {"rates": rates, "lingers": lingers, "duration_s": duration_s, "warmup_s": warmup_s,
                       "repeat": repeat, "record_size": record_size, "acks": 1, "partitions": 1, "quick": quick,
                       "topic_configs": topic_configs or {}}, "rows": rows}


def flat_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in result["rows"]:
        for stage in STAGES:
            stats = row["stages"][stage]
            out.append({"rate": row["rate"], "linger": row["linger_ms"], "run": row.get("run", 1), "stage": stage,
                        **{k.removesuffix("_ms"): stats.get(k) for k in ("p50_ms", "p99_ms", "p99_9_ms", "max_ms")}})
    return out


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    """One row per (rate, linger): the median over runs of each run's e2e p50 and p99; the
    target applies at 10,000 msg/s."""
    out = []
    topic = ", ".join(f"{k}={v}" for k, v in result["config"].get("topic_configs", {}).items())
    keys = list(dict.fromkeys((r["rate"], r["linger_ms"]) for r in result["rows"]))
    for rate, linger in keys:
        runs = [r for r in result["rows"] if (r["rate"], r["linger_ms"]) == (rate, linger)]

        def median(stage: str, q: str) -> float:
            return statistics.median(r["stages"][stage].get(q, float("inf")) for r in runs)

        p50, p99, p999 = median("e2e", "p50_ms"), median("e2e", "p99_ms"), median("e2e", "p99_9_ms")
        stages = "; ".join(f"{s} {median(s, 'p50_ms'):.2f}/{median(s, 'p99_ms'):.2f}" for s in STAGES[:5])
        cpu = "/".join(f"{statistics.median(r.get(k, 0) for r in runs):.0f}%"
                       for k in ("producer_cpu_pct", "broker_cpu_pct", "consumer_cpu_pct"))
        rest = ", ".join(f"{r.get('other_cpu_pct')}%" for r in runs)
        note = (f"median of {len(runs)} run(s) of {result['config']['duration_s']:.0f} s; p99.9 {p999:.2f} ms; stages p50/p99 ms: "
                f"{stages}; {statistics.median(r['records_per_request'] for r in runs)} records/request; "
                f"cpu producer/broker/consumer {cpu}; rest of machine {rest}")
        targeted = rate == TARGET_RATE and not topic
        out.append(SummaryRow(f"produce-to-consume latency, {rate:,} msg/s, linger_ms={linger}" + (f" ({topic})" if topic else ""),
                              f"p50 <= {TARGET_P50_MS} ms, p99 <= {TARGET_P99_MS:.0f} ms" if targeted else "(report)",
                              f"p50 {p50:.2f} / p99 {p99:.2f} ms",
                              (p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS) if targeted else None, note))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[1_000, 10_000, 50_000], help="records per second")
    parser.add_argument("--lingers", type=int, nargs="+", default=[0, 1], help="producer linger_ms values")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per (rate, linger); the summary uses medians")
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="4 s runs")
    parser.add_argument("--output", default="latency", help="results file name (results/<output>.json)")
    parser.add_argument("--topic-config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="configs of the benchmark topic, e.g. flush.messages=1 (acks wait for the group-commit fsync)")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.rates, args.lingers, args.duration_s, args.warmup_s, args.repeat, args.record_size, args.quick,
                 dict(item.split("=", 1) for item in args.topic_config))
    harness.print_table("latency per stage (ms)", flat_rows(result))
    rows = summary(result)
    harness.print_table("latency vs targets", [r.as_dict() for r in rows])
    result["summary"] = [r.as_dict() for r in rows]
    print("wrote", harness.write_results(args.output, result))
    return result


if __name__ == "__main__":
    main()
