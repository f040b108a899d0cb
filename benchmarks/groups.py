"""Consumer groups: rebalance time, group consumption throughput and commit throughput.

One broker process (group.initial.rebalance.delay.ms=0, so a group forms as soon as its members
join); every member is its own process (`harness.Worker`, spawn). Members stamp events with
`time.time()` (the processes share the machine's clock).

- rebalance: a 3-member group on a 100-partition topic (empty, so only the protocol is timed).
  Two members join and settle (50 partitions each); then the third subscribes. The time runs from
  just before the third member's `subscribe()` to the moment every member holds its final
  assignment (the last assignment callback that completes a member's final set of partitions),
  per `partition_assignment_strategy`: range (eager: both old members revoke everything and
  rejoin) and cooperative-sticky (two rounds; old members revoke only what moves). Members learn
  of a rebalance from their next heartbeat, so most of the time is waiting for heartbeats: it is
  measured with heartbeat_interval_ms 1000 and 100 (the latter is close to the protocol's own
  cost), and the third member starts at a random phase of the others' heartbeats.
- throughput: the same data (10M x 100 B values, 6 partitions, loaded once with `send_batch`) read
  once by one plain consumer with `assign()` (all 6 partitions) and once by a 3-member group
  (range, auto-commit every 5 s), both with `poll_arrow()`. The group's clock starts when all three
  members are told to subscribe (so it includes joining and the first rebalances) and stops at the
  last record any member polls; the first-to-last-record window is reported too.
- commits: one member owning 3 partitions commits synchronously, 3 partitions per commit (offsets
  growing), for `--commit-seconds`; commits/s and per-commit latency percentiles.

    python -m benchmarks.groups [--quick] [--only rebalance throughput commits] [--repeat 3]
                                [--records 10000000] [--heartbeat-intervals-ms 1000 100]
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

from benchmarks import consume_throughput, harness
from benchmarks.harness import SummaryRow

BROKER_GROUP_CONFIG = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3}
REBALANCE_PARTITIONS = 100
THROUGHPUT_PARTITIONS = 6
DEFAULT_RECORDS = 10_000_000  # ~1.5 s per read: 3M read in 0.4 s, where joining is a sixth of it
RECORD_SIZE = 100
COMMIT_PARTITIONS = 3
STRATEGIES = ["range", "cooperative-sticky"]


# -- member processes ------------------------------------------------------------------------------


def rebalance_member(bootstrap: str, group: str, topic: str, strategy: str, heartbeat_interval_ms: int,
                     ready: Any, go: Any, stop: Any) -> dict[str, Any]:
    """A member that logs its assignment callbacks (time, kind, partitions) until `stop`."""
    from client import Consumer

    events: list[tuple[float, str, list[int]]] = []

    def logger(kind: str) -> Any:
        def log(tps: list[tuple[str, int]]) -> None:
            if not stop.is_set():  # close() revokes everything: not part of the rebalance
                events.append((time.time(), kind, sorted(p for _, p in tps)))
        return log

    consumer = Consumer(bootstrap, group_id=group, partition_assignment_strategy=[strategy],
                        heartbeat_interval_ms=heartbeat_interval_ms, session_timeout_ms=10_000,
                        enable_auto_commit=False)
    try:
        ready.set()
        go.wait()
        subscribed_at = time.time()
        consumer.subscribe([topic], on_assign=logger("assign"), on_revoke=logger("revoke"), on_lost=logger("lost"))
        while not stop.is_set():
            consumer.poll(timeout_ms=50)
    finally:
        consumer.close()
    return {"subscribed_at": subscribed_at, "events": events}


def group_consume_member(bootstrap: str, group: str, topic: str, counter: Any, ready: Any, go: Any,
                         stop: Any) -> dict[str, Any]:
    """A group member reading with poll_arrow() until `stop`; `counter` (shared) counts its records."""
    from client import Consumer

    harness.warm_up_arrow()
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest")
    count, first, last = 0, None, None
    try:
        ready.set()
        go.wait()
        t0 = time.time()
        consumer.subscribe([topic])
        while not stop.is_set():
            n = consumer.poll_arrow(timeout_ms=100).num_rows
            if n:
                now = time.time()
                first = first if first is not None else now
                last = now
                count += n
                counter.value = count
    finally:
        consumer.close()
    return {"t0": t0, "first": first, "last": last, "records": count}


def commit_member(bootstrap: str, group: str, topic: str, partitions: int, seconds: float, ready: Any,
                  go: Any, broker_pid: int | None = None) -> dict[str, Any]:
    """The only member of a group: once it owns every partition, sync-commit them all, offsets
    growing, for `seconds`."""
    from client import Consumer

    consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.subscribe([topic])
        wanted = {(topic, p) for p in range(partitions)}
        deadline = time.monotonic() + 60
        while set(consumer.assignment()) != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not assigned {sorted(wanted)} in 60 s: {consumer.assignment()}")
            consumer.poll(timeout_ms=100, max_records=1)
        ready.set()
        go.wait()
        latencies: list[float] = []
        meter = harness.WindowMeter("member", broker_pid).start()
        t0 = time.perf_counter()
        end = t0 + seconds
        offset = 0
        while True:
            offset += 1
            started = time.perf_counter()
            consumer.commit({tp: offset for tp in wanted})
            done = time.perf_counter()
            latencies.append((done - started) * 1000)
            if done >= end:
                break
        elapsed = time.perf_counter() - t0
        cpu = meter.stop(elapsed)
        committed = consumer.committed(sorted(wanted))
    finally:
        consumer.close()
    return {"commits": len(latencies), "elapsed_s": round(elapsed, 3), "commits_per_s": round(len(latencies) / elapsed, 1),
            "partitions_per_commit": partitions, "latency": harness.percentiles(latencies),
            "last_offset": offset, "committed": {str(k): str(v) for k, v in dict(committed).items()}, **cpu}


# -- the runs (harness process) --------------------------------------------------------------------


def _wait_group(bootstrap: str, group: str, members: int, partitions: int, timeout_s: float = 60.0) -> None:
    """Wait until `group` is Stable with `members` members owning all `partitions` between them."""
    from client import Admin
    from common.errors import PymqError

    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while time.monotonic() < deadline:
            try:
                (description,) = admin.describe_groups([group])
            except PymqError:
                description = None
            if (description is not None and description.state == "Stable" and len(description.members) == members
                    and sum(len(m.assignment) for m in description.members) == partitions):
                return
            time.sleep(0.05)
    raise RuntimeError(f"group {group} did not settle with {members} members in {timeout_s} s")


def settled_at(result: dict[str, Any]) -> tuple[float, int]:
    """(time, partitions): when the member's callbacks last changed its assignment, and its size."""
    owned: set[int] = set()
    at = result["subscribed_at"]
    for stamp, kind, parts in result["events"]:
        before = set(owned)
        owned = owned | set(parts) if kind == "assign" else owned - set(parts)
        if owned != before:
            at = stamp
    return at, len(owned)


def run_rebalance(broker: harness.BrokerProcess, strategy: str, rep: int, heartbeat_interval_ms: int) -> dict[str, Any]:
    topic, group = "rebalance-bench", f"rebalance-{strategy}-{heartbeat_interval_ms}-{rep}"
    events = [(harness.new_event(), harness.new_event()) for _ in range(3)]
    stop = harness.new_event()
    workers = [harness.Worker(rebalance_member, name=f"member{i}", bootstrap=broker.bootstrap, group=group, topic=topic,
                              strategy=strategy, heartbeat_interval_ms=heartbeat_interval_ms, ready=ready, go=go,
                              stop=stop).start() for i, (ready, go) in enumerate(events)]
    try:
        for ready, _ in events:
            if not ready.wait(120):
                raise RuntimeError("a member did not get ready")
        for _, go in events[:2]:
            go.set()
        _wait_group(broker.bootstrap, group, 2, REBALANCE_PARTITIONS)
        time.sleep(1.0)  # the two settle (cooperative: their second round) before the third comes
        harness.wait_for_quiet()
        time.sleep(random.uniform(0, heartbeat_interval_ms / 1000))  # any phase of the others' heartbeats
        events[2][1].set()
        _wait_group(broker.bootstrap, group, 3, REBALANCE_PARTITIONS)
        time.sleep(2.0)  # every member's last callback runs in its next poll
        stop.set()
        results = [w.result(timeout_s=60) for w in workers]
    finally:
        for w in workers:
            w.kill()
    joined = results[2]["subscribed_at"]
    settled = [settled_at(r) for r in results]
    assert sorted(n for _, n in settled) == [33, 33, 34], settled
    old_revoked = [sum(len(p) for t, k, p in r["events"] if k == "revoke" and t >= joined) for r in results[:2]]
    return {"strategy": strategy, "heartbeat_interval_ms": heartbeat_interval_ms, "run": rep + 1,
            "rebalance_ms": round((max(t for t, _ in settled) - joined) * 1000, 1),
            "new_member_assigned_ms": round((settled[2][0] - joined) * 1000, 1), "old_members_revoked": old_revoked}


def run_group_throughput(broker: harness.BrokerProcess, topic: str, records: int, rep: int) -> dict[str, Any]:
    from multiprocessing import get_context

    group = f"throughput-{rep}"
    counters = [get_context("spawn").RawValue("q", 0) for _ in range(3)]
    ready = [harness.new_event() for _ in range(3)]
    go, stop = harness.new_event(), harness.new_event()
    workers = [harness.Worker(group_consume_member, name=f"member{i}", bootstrap=broker.bootstrap, group=group,
                              topic=topic, counter=counters[i], ready=ready[i], go=go, stop=stop).start()
               for i in range(3)]
    try:
        for event in ready:
            if not event.wait(120):
                raise RuntimeError("a member did not get ready")
        harness.wait_for_quiet()
        meter = harness.CpuMeter({"broker": broker.pid, **{f"member{i}": w.pid for i, w in enumerate(workers)}}).start()
        go.set()
        deadline = time.monotonic() + 600
        while sum(c.value for c in counters) < records and time.monotonic() < deadline:
            time.sleep(0.01)
        cpu = meter.stop()
        stop.set()
        results = [w.result(timeout_s=60) for w in workers]
    finally:
        for w in workers:
            w.kill()
    total = sum(r["records"] for r in results)
    t0 = min(r["t0"] for r in results)
    last = max(r["last"] for r in results if r["last"] is not None)
    first = min(r["first"] for r in results if r["first"] is not None)
    return {"consumer": "group of 3", "run": rep + 1, "records": total, "elapsed_s": round(last - t0, 3),
            "records_per_s": round(total / (last - t0), 1), "first_record_ms": round((first - t0) * 1000, 1),
            "window_records_per_s": round(total / (last - first), 1),
            "per_member": [r["records"] for r in results],
            "member_cpu_pct": [cpu.get(f"member{i}_cpu_pct") for i in range(3)], "broker_cpu_pct": cpu.get("broker_cpu_pct"),
            "other_cpu_pct": cpu.get("other_cpu_pct")}


def run_commits(broker: harness.BrokerProcess, seconds: float, rep: int) -> dict[str, Any]:
    topic = "commit-bench"
    ready, go = harness.new_event(), harness.new_event()
    worker = harness.Worker(commit_member, name="committer", bootstrap=broker.bootstrap, group=f"commits-{rep}",
                            topic=topic, partitions=COMMIT_PARTITIONS, seconds=seconds, ready=ready, go=go,
                            broker_pid=broker.pid).start()
    if not ready.wait(120):
        worker.kill()
        raise RuntimeError("the committer did not get its partitions")
    harness.wait_for_quiet()
    go.set()
    result = worker.result(timeout_s=seconds + 120)
    return {"run": rep + 1, **result}


def run(only: list[str], quick: bool, repeat: int, records: int | None, heartbeat_intervals_ms: list[int],
        commit_seconds: float) -> dict[str, Any]:
    records = records or harness.scaled(DEFAULT_RECORDS, quick)
    out: dict[str, Any] = {"config": {"records": records, "record_size": RECORD_SIZE, "repeat": repeat,
                                      "heartbeat_intervals_ms": heartbeat_intervals_ms, "commit_seconds": commit_seconds,
                                      "broker": BROKER_GROUP_CONFIG, "quick": quick}}
    broker = harness.BrokerProcess(harness.broker_overrides("uvloop", **{k.replace(".", "__"): v
                                                                       for k, v in BROKER_GROUP_CONFIG.items()})).start()
    try:
        if "rebalance" in only:
            harness.create_topic(broker.bootstrap, "rebalance-bench", REBALANCE_PARTITIONS)
            out["rebalance"] = []
            for heartbeat_ms in heartbeat_intervals_ms:
                for strategy in STRATEGIES:
                    for rep in range(repeat):
                        row = run_rebalance(broker, strategy, rep, heartbeat_ms)
                        out["rebalance"].append(row)
                        print(f"  rebalance {strategy:18s} heartbeat {heartbeat_ms:4d} ms run {rep + 1}: "
                              f"{row['rebalance_ms']:8.1f} ms (new member "
                              f"assigned after {row['new_member_assigned_ms']} ms; old members revoked "
                              f"{row['old_members_revoked']})", flush=True)
        if "throughput" in only:
            topic = "group-throughput"
            loaded = consume_throughput.load_topic(broker, topic, THROUGHPUT_PARTITIONS, records)
            print(f"  loaded {records:,} records of {RECORD_SIZE} B at {loaded['records_per_s']:,.0f} msg/s", flush=True)
            out["throughput"] = []
            for rep in range(repeat):
                plain = consume_throughput.run_consumer(broker, topic, THROUGHPUT_PARTITIONS, records, "arrow")
                row = {"consumer": "one, assign()", "run": rep + 1, **plain}
                out["throughput"].append(row)
                print(f"  plain consumer run {rep + 1}: {row['records_per_s']:>12,.0f} msg/s", flush=True)
                row = run_group_throughput(broker, topic, records, rep)
                out["throughput"].append(row)
                print(f"  group of 3     run {rep + 1}: {row['records_per_s']:>12,.0f} msg/s (first record after "
                      f"{row['first_record_ms']} ms; {row['window_records_per_s']:,.0f} msg/s from first to last; "
                      f"per member {row['per_member']})", flush=True)
        if "commits" in only:
            harness.create_topic(broker.bootstrap, "commit-bench", COMMIT_PARTITIONS)
            out["commits"] = []
            for rep in range(repeat):
                row = run_commits(broker, commit_seconds, rep)
                out["commits"].append(row)
                print(f"  commits run {rep + 1}: {row['commits_per_s']:>10,.0f} commits/s (p50 {row['latency']['p50_ms']} ms, "
                      f"p99 {row['latency']['p99_ms']} ms)", flush=True)
    finally:
        broker.stop()
    return out


def _median(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    ordered = sorted(rows, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    out = []
    for heartbeat_ms in result["config"]["heartbeat_intervals_ms"]:
        for strategy in STRATEGIES:
            rows = [r for r in result.get("rebalance", [])
                    if r["strategy"] == strategy and r["heartbeat_interval_ms"] == heartbeat_ms]
            if rows:
                m = _median(rows, "rebalance_ms")
                runs = ", ".join(f"{r['rebalance_ms']:.0f}" for r in rows)
                out.append(SummaryRow(f"group rebalance, 3rd member joins, 100 partitions, {strategy}, heartbeat "
                                      f"{heartbeat_ms} ms", "(report)", f"{m['rebalance_ms']:.0f} ms", None,
                                      f"median of {len(rows)} ({runs} ms); old members revoked "
                                      f"{m['old_members_revoked']} partitions"))
    rows = result.get("throughput", [])
    plain = [r for r in rows if r["consumer"] == "one, assign()"]
    group = [r for r in rows if r["consumer"] == "group of 3"]
    if plain and group:
        p, g = _median(plain, "records_per_s"), _median(group, "records_per_s")
        n = result["config"]["records"]
        out.append(SummaryRow("group consumption, 3 member processes, `poll_arrow()`", "(report)",
                              harness.rate(g["records_per_s"]), None,
                              f"median of {len(group)}; vs one assigned consumer {harness.rate(p['records_per_s'])} "
                              f"({g['records_per_s'] / p['records_per_s']:.2f}x); {n:,} x 100 B, 6 partitions; from the "
                              f"subscribe (first record after {g['first_record_ms']:.0f} ms) to the last record; first to "
                              f"last record {harness.rate(g['window_records_per_s'])}; 2 cores for 3 members + broker"))
    rows = result.get("commits", [])
    if rows:
        m = _median(rows, "commits_per_s")
        out.append(SummaryRow("sync commits from one member, 3 partitions each", "(report)",
                              f"{m['commits_per_s']:,.0f} commits/s", None,
                              f"median of {len(rows)}; p50 {m['latency']['p50_ms']} ms, p99 {m['latency']['p99_ms']} ms "
                              "per commit (each one appended to __consumer_offsets with acks=all before its reply)"))
    return out


THROUGHPUT_COLUMNS = ["consumer", "run", "records", "elapsed_s", "records_per_s", "first_record_ms",
                      "window_records_per_s", "per_member", "consumer_cpu_pct", "member_cpu_pct", "broker_cpu_pct",
                      "other_cpu_pct"]  # the plain consumer's cpu: its own window; the group's: the harness's meter


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.groups", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20x fewer records, 1 run, 1 s of commits")
    parser.add_argument("--only", nargs="*", choices=["rebalance", "throughput", "commits"],
                        default=["rebalance", "throughput", "commits"])
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement [3; --quick 1]")
    parser.add_argument("--records", type=int, default=None, help=f"records for the throughput runs [{DEFAULT_RECORDS:,}]")
    parser.add_argument("--heartbeat-intervals-ms", type=int, nargs="*", default=[1000, 100],
                        help="heartbeat_interval_ms values for the rebalance runs [1000 100]")
    parser.add_argument("--commit-seconds", type=float, default=None, help="seconds of commits per run [5; --quick 1]")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    repeat = args.repeat or (1 if args.quick else 3)
    commit_seconds = args.commit_seconds or (1.0 if args.quick else 5.0)
    result = run(args.only, args.quick, repeat, args.records, args.heartbeat_intervals_ms, commit_seconds)
    if result.get("rebalance"):
        harness.print_table("rebalance", result["rebalance"])
    if result.get("throughput"):
        harness.print_table("group consumption", result["throughput"], THROUGHPUT_COLUMNS)
    if result.get("commits"):
        harness.print_table("commits", [{k: v for k, v in r.items() if k not in ("latency", "committed")}
                                        | {f"{k}": v for k, v in r["latency"].items() if k.endswith("ms")}
                                        for r in result["commits"]])
    rows = summary(result)
    harness.print_table("consumer groups", [r.as_dict() for r in rows])
    result["summary"] = [r.as_dict() for r in rows]
    print("wrote", harness.write_results("groups", result))
    return result


if __name__ == "__main__":
    main()
