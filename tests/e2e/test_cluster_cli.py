"""The cluster from the command line: `pymq cluster start` brings up etcd and three brokers in one
command and stops them all on Ctrl-C; `cluster describe` shows brokers, the controller and the
partitions in trouble; `partition reassign` and `broker decommission` move replicas."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import cli
from client import Admin
from tests.helpers.cluster_scenarios import partitions_of, wait_for, wait_for_full_isr


def pymq(bootstrap: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["-b", bootstrap, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def signal_masks(pid: int) -> str:
    """The blocked, ignored and caught signal masks of a process, from /proc (why a process ignores a signal)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        return repr(e)
    return ", ".join(line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


@pytest.mark.slow
def test_cluster_start_runs_etcd_and_three_brokers_until_ctrl_c(tmp_path: Path):
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "cluster", "start", "--dir", str(tmp_path / "cluster"), "--port", "0",
         "--etcd-port", "0", "-o", "metrics.port=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, "pymq cluster start exited:\n" + "".join(lines)
            lines.append(line)
            if line.startswith("bootstrap:"):
                break
        bootstrap = lines[-1].split(":", 1)[1].strip()
        assert len(bootstrap.split(",")) == 3 and {a.split(":")[0] for a in bootstrap.split(",")} == {
            "127.0.0.1", "127.0.0.2", "127.0.0.3"}
        pymq(bootstrap, "topic", "create", "orders", "-p", "3", "-r", "3")
        with Admin(bootstrap) as admin:
            wait_for_full_isr(admin, "orders")
        described = pymq(bootstrap, "cluster", "describe")
        assert "controller" in described and "3 partitions, all fully replicated and led" in described
        for broker in "012":
            assert re.search(rf"\b{broker}\b.*127\.0\.0\.{int(broker) + 1}:", described)
    finally:
        signal_state = signal_masks(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            logs = {path.parent.name: path.read_text()[-3000:] for path in (tmp_path / "cluster").glob("*/data.out")}
            raise AssertionError(f"pymq cluster start did not stop within 90 s of Ctrl-C (its signal masks before the "
                                 f"Ctrl-C: {signal_state}); its processes' output: {logs}")
    assert process.returncode == 0, output
    assert (tmp_path / "cluster" / "broker-2" / "data" / "orders-2").is_dir()


def test_reassign_and_decommission_from_the_command_line(cluster):
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic("orders", 2, replication_factor=2)
        states = wait_for_full_isr(admin, "orders")
    target = tuple(b for b in range(3) if b not in states[0].replicas) + (states[0].replicas[0],)
    out = pymq(local.bootstrap, "partition", "reassign", "--topic", "orders", "--partition", "0",
               "--replicas", ",".join(map(str, target)))
    assert "all 1 moves completed" in out
    with Admin(local.bootstrap) as admin:
        placed = partitions_of(admin, "orders")
    assert placed[0].replicas == target
    busiest = max(range(3), key=lambda b: sum(b in p.replicas for p in placed.values()))
    dry = pymq(local.bootstrap, "broker", "decommission", str(busiest))
    assert "dry run" in dry
    done = pymq(local.bootstrap, "broker", "decommission", str(busiest), "--execute")
    assert f"broker {busiest} holds no replicas" in done
    with Admin(local.bootstrap) as admin:
        wait_for(lambda: all(busiest not in p.replicas for p in partitions_of(admin, "orders").values()), 30,
                 f"no replica on broker {busiest}")
