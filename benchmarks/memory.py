"""Broker memory while ingesting a large volume: VmRSS sampled every 0.5 s.

One broker process, one producer process (`send_batch`, 1 KiB values, acks=1), optionally one
consumer process tailing the topic (`--tail`). Retention keeps the disk bounded: the topic has
`retention.bytes` (default 2 GiB, per partition as in Kafka) and `segment.bytes` (256 MiB); the
broker runs retention every second (`log.retention.check.interval.ms=1000`) and deletes files
1 s after a segment leaves the log (`file.delete.delay.ms=1000`). The data directory's disk use is
sampled with the RSS.

Refuses to run with less than 15 GiB free where the temporary data directory lives.

    python -m benchmarks.memory [--volume-gb 10] [--tail] [--event-loop uvloop|asyncio] [--output memory]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import GB, KB, MB, SummaryRow

TARGET_RSS_MB = 300
MIN_FREE_BYTES = 15 * GB
RECORD_SIZE = 1024


def tail_worker(bootstrap: str, topic: str, partitions: int, stop: Any, ready: Any = None,
                broker_pid: int | None = None) -> dict[str, Any]:
    """Consumer process: poll_arrow from the log end until `stop` is set and nothing is left."""
    from client import Consumer

    harness.warm_up_arrow()
    count = 0
    with Consumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        if ready is not None:
            ready.set()
        empty_after_stop = 0
        while empty_after_stop < 5:
            n = consumer.poll_arrow(timeout_ms=200).num_rows
            count += n
            if stop.is_set():
                empty_after_stop = empty_after_stop + 1 if not n else 0
    return {"consumed": count, "consumer_peak_rss_mb": round((harness.hwm_kb(__import__("os").getpid()) or 0) / 1024, 1)}


def ingest_worker(bootstrap: str, topic: str, records: int, record_size: int, config: dict[str, Any],
                  broker_pid: int, ready: Any = None, go: Any = None) -> dict[str, Any]:
    import os

    from benchmarks.produce_throughput import produce_worker

    result = produce_worker(bootstrap, topic, "batch", records, record_size, config, broker_pid=broker_pid,
                            warmup_records=10_000, ready=ready, go=go)
    result["producer_peak_rss_mb"] = round((harness.hwm_kb(os.getpid()) or 0) / 1024, 1)
    return result


def run(volume_gb: float = 10.0, partitions: int = 1, retention_bytes: int = 2 * GB, segment_bytes: int = 256 * MB,
        event_loop: str = "uvloop", tail: bool = False, batch_size: int = 1024 * KB, interval_s: float = 0.5,
        min_free: int = MIN_FREE_BYTES) -> dict[str, Any]:
    tmp = Path(tempfile.gettempdir())
    free = shutil.disk_usage(tmp).free
    if free < min_free:
        raise SystemExit(f"refusing to run: {free / GB:.1f} GiB free in {tmp}, need {min_free / GB:.0f} GiB")
    records = int(volume_gb * GB) // RECORD_SIZE
    broker = harness.BrokerProcess(harness.broker_overrides(
        event_loop, **{"log.retention.check.interval.ms": 1000, "file.delete.delay.ms": 1000})).start()
    topic = "memory"
    configs = {"retention.bytes": retention_bytes, "segment.bytes": segment_bytes}
    try:
        harness.create_topic(broker.bootstrap, topic, partitions, configs)
        data_dir = broker.data_dir / "log"
        idle_rss = broker.rss_mb()
        stop = harness.new_event()
        tailer = None
        if tail:
            tail_ready = harness.new_event()
            tailer = harness.Worker(tail_worker, name="tail-consumer", bootstrap=broker.bootstrap, topic=topic,
                                    partitions=partitions, stop=stop, ready=tail_ready).start()
            if not tail_ready.wait(120):
                raise RuntimeError("tail consumer did not get ready")
        ready, go = harness.new_event(), harness.new_event()
        producer_config = {"acks": 1, "batch_size": batch_size, "linger_ms": 5, "max_in_flight": 5}
        producer = harness.Worker(ingest_worker, name="ingest-producer", bootstrap=broker.bootstrap, topic=topic,
                                  records=records, record_size=RECORD_SIZE, config=producer_config,
                                  broker_pid=broker.pid, ready=ready, go=go).start()
        if not ready.wait(120):
            raise RuntimeError("producer did not get ready")
        sampler = harness.RssSampler(broker.pid, interval_s,
                                     probes={"disk_mb": lambda: round(harness.dir_size_bytes(data_dir) / MB, 1)}).start()
        started = time.perf_counter()
        last_report = [started]

        def progress() -> None:
            now = time.perf_counter()
            if now - last_report[0] >= 10 and sampler.samples:
                last_report[0] = now
                s = sampler.samples[-1]
                print(f"  {now - started:6.0f} s: broker RSS {s['rss_mb']:.0f} MB (max {sampler.max_rss_mb:.0f}), "
                      f"disk {s.get('disk_mb', 0) / 1024:.2f} GiB", flush=True)

        go.set()
        produced = producer.result(timeout_s=3 * 3600, on_wait=progress)
        samples = sampler.stop()
        stop.set()
        consumed = tailer.result(timeout_s=300) if tailer is not None else {}
        final_rss = broker.rss_mb()
        peak = (harness.hwm_kb(broker.pid) or 0) / 1024
        final_disk = harness.dir_size_bytes(data_dir)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    rss = [s["rss_mb"] for s in samples]
    disk = [s.get("disk_mb", 0.0) for s in samples]
    return {
        "config": {"volume_gb": volume_gb, "record_size": RECORD_SIZE, "records": records, "partitions": partitions,
                   "retention_bytes": retention_bytes, "segment_bytes": segment_bytes, "event_loop": event_loop,
                   "tail_consumer": tail, "producer": producer_config, "sample_interval_s": interval_s,
                   "free_disk_gb_before": round(free / GB, 1)},
        "result": {
            "ingested_gb": round(records * RECORD_SIZE / GB, 2), "elapsed_s": produced["elapsed_s"],
            "mb_per_s": produced["mb_per_s"], "records_per_s": produced["records_per_s"],
            "broker_idle_rss_mb": round(idle_rss or 0, 1), "broker_max_rss_mb": max(rss, default=0.0),
            "broker_final_rss_mb": round(final_rss or 0, 1), "broker_vmhwm_mb": round(peak, 1),
            "broker_mean_rss_mb": round(sum(rss) / len(rss), 1) if rss else 0.0,
            "max_disk_mb": max(disk, default=0.0), "final_disk_mb": round(final_disk / MB, 1),
            "samples": len(samples), "producer_cpu_pct": produced.get("producer_cpu_pct"),
            "broker_cpu_pct": produced.get("broker_cpu_pct"), "other_cpu_pct": produced.get("other_cpu_pct"),
            "producer_peak_rss_mb": produced.get("producer_peak_rss_mb"), **consumed,
        },
        "samples": samples,
    }


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    r, c = result["result"], result["config"]
    note = (f"{r['ingested_gb']:.1f} GiB of 1 KiB values via send_batch at {r['mb_per_s']:.0f} MB/s; VmRSS every "
            f"{c['sample_interval_s']} s: idle {r['broker_idle_rss_mb']:.0f} MB, mean {r['broker_mean_rss_mb']:.0f}, "
            f"final {r['broker_final_rss_mb']:.0f}, VmHWM {r['broker_vmhwm_mb']:.0f} MB; disk max "
            f"{r['max_disk_mb'] / 1024:.2f} GiB (retention.bytes {c['retention_bytes'] / GB:.0f} GiB, segment.bytes "
            f"{c['segment_bytes'] // MB} MiB){'; with a tailing consumer' if c['tail_consumer'] else ''}")
    label = f"broker RSS while ingesting {c['volume_gb']:g} GiB"
    return [SummaryRow(label, f"< {TARGET_RSS_MB} MB", f"max {r['broker_max_rss_mb']:.0f} MB",
                       r["broker_max_rss_mb"] < TARGET_RSS_MB, note)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--volume-gb", type=float, default=10.0, help="GiB of record values to ingest [10]")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--retention-gb", type=float, default=2.0, help="topic retention.bytes (per partition) in GiB")
    parser.add_argument("--segment-mb", type=int, default=256, help="topic segment.bytes in MiB")
    parser.add_argument("--event-loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--tail", action="store_true", help="also run a consumer tailing the topic")
    parser.add_argument("--quick", action="store_true", help="volume / 20")
    parser.add_argument("--output", default="memory", help="results file name (results/<output>.json)")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    volume = args.volume_gb / 20 if args.quick else args.volume_gb
    result = run(volume, args.partitions, int(args.retention_gb * GB), args.segment_mb * MB, args.event_loop, args.tail)
    harness.print_table("broker memory", [result["result"]])
    rows = summary(result)
    harness.print_table("memory vs target", [r.as_dict() for r in rows])
    result["summary"] = [r.as_dict() for r in rows]
    print("wrote", harness.write_results(args.output, result))
    return result


if __name__ == "__main__":
    main()
