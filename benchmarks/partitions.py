"""Many partitions and crash restarts: what creating a topic costs and what it does to every other
connection, what 10,000 partitions hold open, and how long a restart after SIGKILL takes with a
large log on disk.

- creation: `Admin.create_topic` of 1,000 and then 10,000 partitions, timed from request to
  response. Meanwhile a probe thread sends a Metadata request for a one-partition topic every 5 ms
  on its own connection and records each round trip: the worst and the p99 during the creation
  are what another client would have seen.
- at 10,000 partitions: the broker's open file descriptors (`/proc/PID/fd`) and VmRSS right after
  the creation, and again after one record was produced to every partition (every active segment
  touched once: the segment file cache bounds what stays open).
- restart: a 3-partition topic filled with `--restart-gb` of 1 KiB values (`send_batch`, 1 GiB
  segments as in `conf/broker.toml`, the default flush policy: no time-based fsync), the broker SIGKILLed right after the last acknowledgement,
  then restarted on the same directory with the page cache dropped (as after the power loss that
  makes recovery matter; needs root): the time from spawn to "listening", and the bytes the broker
  says it re-validated. The same after a clean stop, for comparison.

    python -m benchmarks.partitions [--counts 1000 10000] [--restart-gb 10] [--quick]
"""
from __future__ import annotations

import argparse
import os
import re
import threading
import time
from typing import Any

from benchmarks import harness
from benchmarks.harness import SummaryRow

GB = 1 << 30
INT64_MAX = (1 << 63) - 1
PROBE_INTERVAL_S = 0.005


class Probe:
    """Metadata round trips on a connection of its own, every PROBE_INTERVAL_S, in a thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from client import Admin

        self.admin = Admin(bootstrap)
        self.topic = topic
        self.samples: list[tuple[float, float]] = []  # (start, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def __enter__(self) -> "Probe":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)
        self.admin.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            self.admin.describe_topics([self.topic])
            self.samples.append((start, time.monotonic() - start))
            self._stop.wait(PROBE_INTERVAL_S)

    def during(self, start: float, end: float) -> dict[str, float]:
        inside = [seconds * 1000 for began, seconds in self.samples if start <= began <= end]
        stats = harness.percentiles(inside)
        return {"probes": len(inside), "probe_p99_ms": stats.get("p99_ms"), "probe_max_ms": stats.get("max_ms")}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def create_partitions(counts: list[int]) -> list[dict[str, Any]]:
    from client import Admin, Producer

    broker = harness.BrokerProcess(harness.broker_overrides()).start()
    rows = []
    try:
        harness.create_topic(broker.bootstrap, "probe", 1)
        with Admin(broker.bootstrap, request_timeout_ms=900_000) as admin, Probe(broker.bootstrap, "probe") as probe:
            time.sleep(0.5)  # probe warm
            for count in counts:
                harness.wait_for_quiet()
                fds_before = open_fds(broker.pid)
                start = time.monotonic()
                admin.create_topic(f"wide-{count}", partitions=count)
                end = time.monotonic()
                time.sleep(0.2)
                row = {"partitions": count, "create_s": round(end - start, 2), **probe.during(start, end),
                       "fds_after_create": open_fds(broker.pid) - fds_before, "rss_mb": round(broker.rss_mb() or 0, 1)}
                print(f"  {count:,} partitions: created in {row['create_s']} s; probe p99 {row['probe_p99_ms']} ms, "
                      f"worst {row['probe_max_ms']} ms; +{row['fds_after_create']} fds; RSS {row['rss_mb']} MB", flush=True)
                rows.append(row)
        largest = max(counts)
        with Producer(broker.bootstrap, linger_ms=5) as producer:
            start = time.monotonic()
            for p in range(largest):
                producer.send(f"wide-{largest}", b"x" * 100, partition=p)
            producer.flush()
            produce_s = time.monotonic() - start
        rows[-1].update({"produce_one_each_s": round(produce_s, 2), "fds_after_produce": open_fds(broker.pid),
                         "rss_after_produce_mb": round(broker.rss_mb() or 0, 1)})
        print(f"  one record to each of {largest:,} partitions in {produce_s:.2f} s: {rows[-1]['fds_after_produce']} "
              f"fds open, RSS {rows[-1]['rss_after_produce_mb']} MB", flush=True)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    return rows


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (needs root), as after the power loss or reboot that makes a
    crash recovery matter: re-validating a log then means reading it from the disk. False if not
    permitted (the restart then reads from memory and the times flatter a large tail)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        return False
    return True


def timed_start(broker: harness.BrokerProcess) -> tuple[float, int | None]:
    """Seconds from spawn to listening (page cache dropped first), and the bytes the broker
    re-validated (its recovery line)."""
    drop_page_cache()
    start = time.monotonic()
    broker.start(timeout_s=1800)
    elapsed = time.monotonic() - start
    found = re.findall(r"recovered (\d+) bytes of \d+ logs", broker.log_tail(1 << 20))
    return elapsed, int(found[-1]) if found else None


def restart(volume_gb: float) -> dict[str, Any]:
    from benchmarks.memory import ingest_worker

    # The default flush policy (no time-based flush; conf/broker.toml flushes every second): what
    # a restart re-validates then depends on the log layer alone.
    broker = harness.BrokerProcess(harness.broker_overrides(**{"log.flush.interval.ms": INT64_MAX})).start()
    try:
        harness.create_topic(broker.bootstrap, "restart", 3)
        records = int(volume_gb * GB / 1024)
        started = time.monotonic()
        harness.run_worker(ingest_worker, name="restart-ingest", timeout_s=3600, bootstrap=broker.bootstrap,
                           topic="restart", records=records, record_size=1024,
                           config={"acks": 1, "linger_ms": 5, "batch_size": 1 << 20, "compression": "none"},
                           broker_pid=broker.pid)
        ingest_s = time.monotonic() - started
        on_disk = harness.dir_size_bytes(broker.log_dir)
        broker.kill()  # right after the last acknowledgement: the active segments were never flushed
        harness.wait_for_writeback()
        killed_s, killed_bytes = timed_start(broker)
        broker.stop()
        clean_s, clean_bytes = timed_start(broker)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    row = {"on_disk_gb": round(on_disk / GB, 2), "ingest_s": round(ingest_s, 1), "cold_cache": drop_page_cache(),
           "restart_after_sigkill_s": round(killed_s, 2), "revalidated_after_sigkill_mb": round((killed_bytes or 0) / 2**20, 1),
           "restart_after_clean_stop_s": round(clean_s, 2), "revalidated_after_clean_stop_mb": round((clean_bytes or 0) / 2**20, 1)}
    print(f"  {row['on_disk_gb']} GiB on disk: restart after SIGKILL {row['restart_after_sigkill_s']} s "
          f"(re-validated {row['revalidated_after_sigkill_mb']} MB), after a clean stop {row['restart_after_clean_stop_s']} s",
          flush=True)
    return row


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    out = []
    for row in result.get("creation", []):
        out.append(SummaryRow(
            f"create a {row['partitions']:,}-partition topic", "seconds, other connections unaffected",
            f"{row['create_s']} s; other connection worst {row['probe_max_ms']} ms", None,
            f"probe Metadata every 5 ms on another connection: {row['probes']} round trips during the creation, "
            f"p99 {row['probe_p99_ms']} ms; +{row['fds_after_create']} fds, RSS {row['rss_mb']} MB after it"))
    if result.get("creation"):
        last = result["creation"][-1]
        out.append(SummaryRow(
            f"open fds and RSS at {last['partitions']:,} partitions", "bounded (log.max.open.files)",
            f"{last['fds_after_produce']} fds, {last['rss_after_produce_mb']} MB", None,
            f"after one record to each partition ({last['produce_one_each_s']} s); right after the creation "
            f"+{last['fds_after_create']} fds, {last['rss_mb']} MB"))
    if result.get("restart"):
        r = result["restart"]
        out.append(SummaryRow(
            f"restart after SIGKILL with {r['on_disk_gb']} GiB on disk", "depends on the unflushed tail only",
            f"{r['restart_after_sigkill_s']} s", None,
            f"re-validated {r['revalidated_after_sigkill_mb']} MB (the active segments); after a clean stop "
            f"{r['restart_after_clean_stop_s']} s, {r['revalidated_after_clean_stop_mb']} MB; page cache "
            f"{'dropped before each start' if r.get('cold_cache') else 'warm (not root)'}"))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.partitions", description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="*", default=[1000, 10_000], help="partition counts to create")
    parser.add_argument("--restart-gb", type=float, default=10.0, help="GiB on disk before the SIGKILL restart (0 skips)")
    parser.add_argument("--quick", action="store_true", help="1,000 partitions and 0.5 GiB")
    args = parser.parse_args(argv)
    if args.quick:
        args.counts, args.restart_gb = [1000], min(args.restart_gb, 0.5)
    harness.install_cleanup()
    result: dict[str, Any] = {"config": {"counts": args.counts, "restart_gb": args.restart_gb, "quick": args.quick}}
    if args.counts:
        result["creation"] = create_partitions(sorted(args.counts))
    if args.restart_gb > 0:
        result["restart"] = restart(args.restart_gb)
    rows = summary(result)
    result["summary"] = [row.as_dict() for row in rows]
    harness.print_table("partitions and restarts", [row.as_dict() for row in rows])
    print(f"wrote {harness.write_results('partitions', result)}")
    return result


if __name__ == "__main__":
    main()
