"""Event-loop lag and bounded memory under produce floods that outrun the disk.

    python -m benchmarks.loop_lag              # both scenarios, 20 s floods
    python -m benchmarks.loop_lag --quick      # 6 s floods
    python -m benchmarks.loop_lag --only slow_flush

The broker runs on a slow disk (benchmarks/slow_disk_broker.py: a test double that sleeps before
each segment write and each `.log` fsync). Producer processes flood it with pipelined 1 MiB
produces (acks=1) over raw connections; meanwhile the harness times, on connections of its own,
a Metadata request every 10 ms (the client-side view of the loop's lag: a request waits as long as
the loop is busy elsewhere) and a CreateTopics every second.

- slow_disk: every segment write takes PWRITE_MS: the log writer's queue fills. Before the fix the
  event loop waited for the writer (every connection stalled); now only the producers are muted.
- slow_flush: topics with flush.messages=1 and a slow fsync, so acks wait for flushes and the
  requests pile up in the broker: peak RSS shows whether request memory is bounded
  (queued.max.request.bytes) or only by a per-connection request count.

Reported: Metadata latency (p50/p99/max), CreateTopics latency (max), the broker's own lag probe
(pymq_event_loop_lag_seconds; absent from builds without it), peak broker RSS (VmHWM) and the
acked produce throughput. Works against any build that takes the default configs (run it with
another checkout on PYTHONPATH for a before/after comparison).
"""
from __future__ import annotations

import argparse
import re
import socket
import struct
import threading
import time
import urllib.request
from typing import Any

from benchmarks import harness
from benchmarks.harness import MB, SummaryRow

SCENARIOS: dict[str, dict[str, Any]] = {
    "slow_disk": {"pwrite_ms": 20, "fsync_ms": 0, "topic_configs": {}, "producers": 4, "in_flight": 32},
    "slow_flush": {"pwrite_ms": 0, "fsync_ms": 100, "topic_configs": {"flush.messages": "1"}, "producers": 4,
                   "in_flight": 200},
}
BATCH_VALUES = 1024  # values of 1 KiB: one ~1 MiB batch per produce
PARTITIONS = 4
PING_INTERVAL_S = 0.010
FLOOD_S = 20.0


# -- raw wire client (no client library: the same code talks to any build) --------------------


class RawConnection:
    def __init__(self, bootstrap: str, timeout_s: float = 120.0) -> None:
        import protocol

        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.protocol = protocol
        self.next_id = 0

    def frame(self, api_key: int, control: dict[str, Any], payload: bytes = b"") -> bytes:
        self.next_id += 1
        return self.protocol.encode_request(api_key, 0, self.next_id, control, len(payload)) + payload

    def recv(self) -> dict[str, Any]:
        import msgpack

        size = struct.unpack(">i", self._exactly(4))[0]
        body = self._exactly(size)
        _, control_length = struct.unpack_from(">ii", body)
        return msgpack.unpackb(body[8:8 + control_length], raw=False)

    def request(self, api_key: int, control: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(self.frame(api_key, control))
        return self.recv()

    def _exactly(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)


def flood_worker(bootstrap: str, topic: str, partition: int, in_flight: int, duration_s: float) -> dict[str, Any]:
    """Runs in a producer process: pipelined produces of one ~1 MiB batch, `in_flight` at a time."""
    from protocol import ApiKey
    from segment_format import batch_body, record

    values = [bytes([65 + i % 26]) * 1024 for i in range(BATCH_VALUES)]
    data = bytes(record.encode_batch(batch_body.make_body(values, timestamps_ms=int(time.time() * 1000))))
    conn = RawConnection(bootstrap)
    control = {"acks": 1, "timeout_ms": 120_000,
               "topics": [{"name": topic, "partitions": [{"partition": partition, "size": len(data)}]}]}
    slots = threading.Semaphore(in_flight)
    acked, errors = [0], [0]
    stop_at = time.monotonic() + duration_s
    sent = [0]

    def receive() -> None:
        while True:
            reply = conn.recv()
            code = reply["topics"][0]["partitions"][0]["error_code"]
            if code:
                errors[0] += 1
            else:
                acked[0] += 1
            slots.release()
            if acked[0] + errors[0] == sent[0] and time.monotonic() >= stop_at:
                return

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    while time.monotonic() < stop_at:
        if not slots.acquire(timeout=0.1):
            continue
        conn.sock.sendall(conn.frame(ApiKey.PRODUCE, control, data))
        sent[0] += 1
    receiver.join(300)
    return {"acked": acked[0], "errors": errors[0], "batch_bytes": len(data)}


class Pinger:
    """Times a Metadata request every PING_INTERVAL_S and (unless told not to) a CreateTopics
    every second, each on a connection of its own, until stopped."""

    def __init__(self, bootstrap: str, create_topics: bool = True) -> None:
        self.bootstrap = bootstrap
        self.metadata_ms: list[float] = []
        self.create_ms: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._metadata, daemon=True)]
        if create_topics:
            self._threads.append(threading.Thread(target=self._create_topics, daemon=True))

    def start(self) -> "Pinger":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)

    def _metadata(self) -> None:
        from protocol import ApiKey

        conn = RawConnection(self.bootstrap)
        while not self._stop.is_set():
            started = time.perf_counter()
            conn.request(ApiKey.METADATA, {"topics": []})
            self.metadata_ms.append((time.perf_counter() - started) * 1000)
            time.sleep(PING_INTERVAL_S)

    def _create_topics(self) -> None:
        from protocol import ApiKey

        conn = RawConnection(self.bootstrap)
        n = 0
        while not self._stop.wait(1.0):
            n += 1
            started = time.perf_counter()
            conn.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": f"probe-{n}", "num_partitions": 1}]})
            self.create_ms.append((time.perf_counter() - started) * 1000)


def broker_lag(metrics_port: int) -> dict[str, float] | None:
    """The broker's own probe (None for builds without it): worst lag and p99 (bucket bound)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    worst = re.search(r"^pymq_event_loop_lag_max_seconds (\S+)$", text, re.M)
    if worst is None:
        return None
    buckets = [(float(le), float(n)) for le, n in
               re.findall(r'^pymq_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)]
    total = buckets[-1][1]
    p99 = next(le for le, n in buckets if n >= 0.99 * total)
    return {"max_ms": round(float(worst.group(1)) * 1000, 1), "p99_le_ms": p99 * 1000, "ticks": int(total)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_scenario(name: str, duration_s: float) -> dict[str, Any]:
    spec = SCENARIOS[name]
    metrics_port = free_port()
    broker = harness.BrokerProcess(harness.broker_overrides("uvloop", metrics__port=metrics_port))
    broker.module = "benchmarks.slow_disk_broker"
    broker.env = {"PYMQ_SLOW_PWRITE_MS": str(spec["pwrite_ms"]), "PYMQ_SLOW_FSYNC_MS": str(spec["fsync_ms"])}
    broker.start()
    try:
        harness.create_topic(broker.bootstrap, "flood", PARTITIONS, spec["topic_configs"])
        harness.wait_for_quiet()
        workers = [harness.Worker(flood_worker, name=f"flood-{i}", bootstrap=broker.bootstrap, topic="flood",
                                  partition=i % PARTITIONS, in_flight=spec["in_flight"], duration_s=duration_s).start()
                   for i in range(spec["producers"])]
        pinger = Pinger(broker.bootstrap).start()
        started = time.monotonic()
        results = [w.result(timeout_s=duration_s + 600) for w in workers]
        elapsed = time.monotonic() - started
        pinger.stop()
        peak_rss = harness.hwm_kb(broker.pid)
        lag = broker_lag(metrics_port)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    acked_bytes = sum(r["acked"] * r["batch_bytes"] for r in results)
    return {"scenario": name, **{k: v for k, v in spec.items() if k != "topic_configs"},
            "topic_configs": spec["topic_configs"], "flood_s": duration_s, "elapsed_s": round(elapsed, 1),
            "acked_mb_per_s": round(acked_bytes / elapsed / MB, 1), "errors": sum(r["errors"] for r in results),
            "peak_rss_mb": round((peak_rss or 0) / 1024, 1),
            "metadata": harness.percentiles(pinger.metadata_ms), "create_topics": harness.percentiles(pinger.create_ms),
            "broker_lag": lag}


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    out = []
    for row in result["rows"]:
        meta, lag = row["metadata"], row["broker_lag"]
        probe = f"; broker probe worst {lag['max_ms']} ms, p99 <= {lag['p99_le_ms']} ms" if lag else ""
        out.append(SummaryRow(f"{row['scenario']}: Metadata latency during a produce flood (worst)", "(report)",
                              f"{meta.get('max_ms', '?')} ms", None,
                              f"p50 {meta.get('p50_ms')} / p99 {meta.get('p99_ms')} ms; CreateTopics worst "
                              f"{row['create_topics'].get('max_ms', '?')} ms; peak broker RSS {row['peak_rss_mb']} MB; "
                              f"acked {row['acked_mb_per_s']} MB/s{probe}"))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_lag", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 s floods")
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="run only these scenarios")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    rows = []
    for name in args.only or list(SCENARIOS):
        row = run_scenario(name, 6.0 if args.quick else FLOOD_S)
        print(f"  {name}: {row}", flush=True)
        rows.append(row)
    result: dict[str, Any] = {"rows": rows}
    summaries = summary(result)
    harness.print_table("event-loop lag under produce floods", [r.as_dict() for r in summaries])
    result["summary"] = [r.as_dict() for r in summaries]
    print("wrote", harness.write_results("loop_lag", result))
    return result


if __name__ == "__main__":
    main()
