"""Exactly once: what the idempotent producer (the default) and transactions cost.

One broker process, one producer process per run (benchmarks/produce_throughput.py's worker).
Each idempotence workload runs plain (`enable_idempotence=False`) and idempotent alternately,
REPEAT times each on the same broker, acks=1, and compares the median runs:

- send100_p1: per-record `send()` of 100-byte values to one partition (batch_size 1 MiB, linger 5 ms)
- batch100_p3: `send_batch()` of 100-byte values over three partitions (batch_size 512 KiB)

Transactions (`txn100_p3`): per-record `send()` of 100-byte values over three partitions by a
transactional producer that commits every 100 ms, against the same sends by the idempotent
producer with acks=all (what a transactional producer uses), alternately, REPEAT times each.

    python -m benchmarks.exactly_once            # full volumes
    python -m benchmarks.exactly_once --quick    # ~20x smaller

Target: the default (idempotent) costs under 5 % of the plain producer's throughput.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import harness, produce_throughput
from benchmarks.harness import KB, SummaryRow

# name -> (mode, record size, records, partitions, producer config)
WORKLOADS: dict[str, tuple[str, int, int, int, dict[str, Any]]] = {
    "send100_p1": ("send", 100, 2_000_000, 1, {"batch_size": 1024 * KB, "linger_ms": 5}),
    "batch100_p3": ("batch", 100, 5_000_000, 3, {"batch_size": 512 * KB, "linger_ms": 5}),
}
REPEAT = 3
MAX_COST = 0.05
TXN_RECORDS = 1_000_000
COMMIT_INTERVAL_S = 0.1


def txn_worker(bootstrap: str, topic: str, records: int, transactional: bool, ready: Any = None,
               go: Any = None) -> dict[str, Any]:
    """Runs in the producer process: `records` sends to 3 partitions, committed every 100 ms
    (transactional) or flushed at the end (the idempotent producer, acks=all)."""
    from client import Producer

    harness.warm_up_arrow()
    values = harness.value_list(100, 1024)
    config: dict[str, Any] = {"acks": "all", "linger_ms": 5, "batch_size": 1024 * KB}
    if transactional:
        config["transactional_id"] = f"bench-{topic}"
    with Producer(bootstrap, **config) as producer:
        if transactional:
            producer.init_transactions()
            producer.begin_transaction()
        for i in range(20_000):  # warm-up: connections, the coordinator, code paths
            producer.send(topic, values[i & 1023], partition=i % 3)
        if transactional:
            producer.commit_transaction()
        producer.flush()
        if ready is not None:
            ready.set()
        if go is not None:
            go.wait()
        commits = 0
        t0 = time.perf_counter()
        next_commit = t0 + COMMIT_INTERVAL_S
        if transactional:
            producer.begin_transaction()
        send = producer.send
        for i in range(records):
            send(topic, values[i & 1023], partition=i % 3)
            if transactional and i & 255 == 0 and time.perf_counter() >= next_commit:
                producer.commit_transaction()
                commits += 1
                producer.begin_transaction()
                next_commit = time.perf_counter() + COMMIT_INTERVAL_S
        if transactional:
            producer.commit_transaction()
            commits += 1
        producer.flush()
        elapsed = time.perf_counter() - t0
    return {"records": records, "elapsed_s": round(elapsed, 3), "records_per_s": round(records / elapsed, 1),
            "commits": commits}


def run_txn(broker: harness.BrokerProcess, transactional: bool, records: int) -> dict[str, Any]:
    topic = f"txn-{int(time.time() * 1000) % 10_000_000}"
    harness.create_topic(broker.bootstrap, topic, 3)
    try:
        ready, go = harness.new_event(), harness.new_event()
        worker = harness.Worker(txn_worker, name="txn-producer", bootstrap=broker.bootstrap, topic=topic,
                                records=records, transactional=transactional, ready=ready, go=go).start()
        while not ready.wait(0.5):
            if not worker.process.is_alive():
                worker.result(timeout_s=5)
        harness.wait_for_quiet()
        go.set()
        return worker.result(timeout_s=1800)
    finally:
        harness.delete_topic(broker.bootstrap, topic)


def run(quick: bool = False, only: list[str] | None = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    broker = harness.BrokerProcess(harness.broker_overrides("uvloop")).start()
    try:
        for name, (mode, size, records, partitions, config) in WORKLOADS.items():
            if only and name not in only:
                continue
            for rep in range(1 if quick else REPEAT):
                for idempotent in (False, True):
                    row = produce_throughput.run_one(broker, name, mode, size, harness.scaled(records, quick),
                                                     {**config, "enable_idempotence": idempotent}, partitions)
                    row.update(run=rep + 1, idempotent=idempotent)
                    print(f"  {name:12s} {'idempotent' if idempotent else 'plain     '} run {rep + 1}: "
                          f"{row['records_per_s']:>12,.0f} msg/s (cpu: producer {row['producer_cpu_pct']}%, "
                          f"broker {row.get('broker_cpu_pct', '?')}%)", flush=True)
                    rows.append(row)
        if not only or "txn100_p3" in only:
            for rep in range(1 if quick else REPEAT):
                for transactional in (False, True):
                    row = run_txn(broker, transactional, harness.scaled(TXN_RECORDS, quick))
                    row.update(workload="txn100_p3", run=rep + 1, transactional=transactional)
                    print(f"  txn100_p3    {'transactional' if transactional else 'idempotent   '} run {rep + 1}: "
                          f"{row['records_per_s']:>12,.0f} msg/s ({row['commits']} commits)", flush=True)
                    rows.append(row)
    finally:
        broker.stop()
        harness.remove_temp_dir(broker.data_dir)
    return {"config": {"quick": quick, "acks": 1, "repeat": REPEAT}, "rows": rows}


def _median(rows: list[dict[str, Any]]) -> float:
    rates = sorted(r["records_per_s"] for r in rows)
    return rates[(len(rates) - 1) // 2]


def comparisons(result: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """workload -> (plain median msg/s, idempotent median msg/s)."""
    out = {}
    for name in WORKLOADS:
        plain = [r for r in result["rows"] if r["workload"] == name and not r["idempotent"]]
        idem = [r for r in result["rows"] if r["workload"] == name and r["idempotent"]]
        if plain and idem:
            out[name] = (_median(plain), _median(idem))
    return out


def txn_comparison(result: dict[str, Any]) -> tuple[float, float, int] | None:
    """(idempotent acks=all median msg/s, transactional median msg/s, its commits) of txn100_p3."""
    idem = [r for r in result["rows"] if r["workload"] == "txn100_p3" and not r["transactional"]]
    txn = [r for r in result["rows"] if r["workload"] == "txn100_p3" and r["transactional"]]
    if not idem or not txn:
        return None
    median_txn = sorted(txn, key=lambda r: r["records_per_s"])[(len(txn) - 1) // 2]
    return _median(idem), median_txn["records_per_s"], median_txn["commits"]


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    for name, (plain, idem) in comparisons(result).items():
        cost = 1 - idem / plain
        rows.append(SummaryRow(f"idempotent producer's cost, {name}", f"< {MAX_COST:.0%}",
                               f"{cost:+.1%} ({idem:,.0f} vs {plain:,.0f} msg/s plain)", cost < MAX_COST,
                               f"median of {REPEAT} alternating runs each"))
    txn = txn_comparison(result)
    if txn is not None:
        idem, transactional, commits = txn
        rows.append(SummaryRow("transactional produce, commits every 100 ms (txn100_p3)", "measured",
                               f"{transactional:,.0f} msg/s ({transactional / idem:.0%} of the idempotent producer's "
                               f"{idem:,.0f} with acks=all)", None, f"{commits} commits in the median run"))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exactly_once", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes")
    parser.add_argument("--only", nargs="*", choices=[*WORKLOADS, "txn100_p3"], help="run only these workloads")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.quick, args.only)
    print("wrote", harness.write_results("exactly_once", result))
    print(harness.markdown_table(summary(result)))
    return result


if __name__ == "__main__":
    main()
