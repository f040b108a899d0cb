"""Exactly once: what the idempotent producer (the default) costs against a plain one.

One broker process, one producer process per run (benchmarks/produce_throughput.py's worker), acks=1.
Each workload runs plain (`enable_idempotence=False`) and idempotent alternately, REPEAT times
each on the same broker, and compares the median runs:

- send100_p1: per-record `send()` of 100-byte values to one partition (batch_size 1 MiB, linger 5 ms)
- batch100_p3: `send_batch()` of 100-byte values over three partitions (batch_size 512 KiB)

    python -m benchmarks.exactly_once            # full volumes
    python -m benchmarks.exactly_once --quick    # ~20x smaller

Target: the default (idempotent) costs under 5 % of the plain producer's throughput.
"""
from __future__ import annotations

import argparse
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


def summary(result: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    for name, (plain, idem) in comparisons(result).items():
        cost = 1 - idem / plain
        rows.append(SummaryRow(f"idempotent producer's cost, {name}", f"< {MAX_COST:.0%}",
                               f"{cost:+.1%} ({idem:,.0f} vs {plain:,.0f} msg/s plain)", cost < MAX_COST,
                               f"median of {REPEAT} alternating runs each"))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exactly_once", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes")
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="run only these workloads")
    args = parser.parse_args(argv)
    harness.install_cleanup()
    result = run(args.quick, args.only)
    print("wrote", harness.write_results("exactly_once", result))
    print(harness.markdown_table(summary(result)))
    return result


if __name__ == "__main__":
    main()
