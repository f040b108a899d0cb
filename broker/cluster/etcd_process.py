"""EtcdProcess: an etcd member run as a child process, for a local cluster and tests; `start_members`
starts several as one etcd cluster.

A pymq cluster keeps its metadata in etcd (docs/cluster.md). Production runs etcd as its own
service; `pymq cluster start`, the tests and the benchmarks start one here: Debian's `etcd`
binary (package `etcd-server`, which `make venv` installs when missing), on free loopback ports
unless told otherwise, a data directory of its own, and the limits pymq's transactions need.
Creating a topic is ONE etcd transaction holding the topic key and every partition's state, so a
10,000-partition topic is 10,001 operations: etcd's defaults (128 operations, 1.5 MiB per request)
are raised rather than the creation chunked, because a chunked creation could be seen half done.

The child dies with its parent (PR_SET_PDEATHSIG) and is stopped by PID.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from broker.cluster.metadata_store import MAX_TXN_OPS
from common.child_process import ChildProcess, die_with_parent

# One etcd request carries a transaction of MAX_TXN_OPS puts of partition states (~120 bytes each).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
ETCD_LIMIT_FLAGS = ("--max-txn-ops", str(MAX_TXN_OPS), "--max-request-bytes", str(MAX_REQUEST_BYTES))


class EtcdNotInstalledError(RuntimeError):
    """No `etcd` binary on PATH."""


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if found is None:
        raise EtcdNotInstalledError("etcd is not installed: `make venv` installs Debian's etcd-server "
                                    "(or run `apt-get install etcd-server`)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EtcdProcess(ChildProcess):
    """One etcd member. `endpoint` is `host:port` of its client URL once started."""

    what = "etcd"
    stop_timeout_s = 10.0

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", client_port: int = 0, peer_port: int = 0,
                 output: Path | None = None, name: str = "pymq-etcd", limits: Sequence[str] = ETCD_LIMIT_FLAGS,
                 initial_cluster: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.initial_cluster = initial_cluster  # `name=peer_url,...` of every member; None: this one alone
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.output = output or self.data_dir.parent / f"{self.data_dir.name}.out"
        self.name = name
        self.limits = tuple(limits)  # () leaves etcd's defaults (which refuse large topics)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self, timeout_s: float = 30.0) -> "EtcdProcess":
        """Start etcd and wait until it answers /health; RuntimeError with its output otherwise.
        Free ports are picked once and kept, so a restart serves the same endpoint."""
        self.launch()
        self.wait_healthy(timeout_s)
        return self

    def launch(self) -> None:
        """Start the process without waiting (a member of several is healthy only once a quorum runs)."""
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        client_url, peer_url = f"http://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
        args = [
            etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer_url}", "--initial-cluster-state", "new",
            "--logger", "zap", "--log-outputs", "stderr",
            *self.limits,
        ]
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, preexec_fn=die_with_parent)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"etcd did not start; output:\n{self.log_tail()}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as response:
                return b'"true"' in response.read()
        return False

    def __enter__(self) -> "EtcdProcess":
        return self.start()


def start_members(root: Path, count: int = 3, host: str = "127.0.0.1", timeout_s: float = 30.0) -> list[EtcdProcess]:
    """`count` etcd members forming one cluster, on free ports of `host`, data under `root`;
    `endpoints(members)` is what brokers are given. Every one is killed if any fails to start."""
    members = [EtcdProcess(Path(root) / f"member-{i}" / "data", host=host, name=f"pymq-etcd-{i}",
                           client_port=free_port(host), peer_port=free_port(host)) for i in range(count)]
    initial = ",".join(f"{m.name}=http://{m.host}:{m.peer_port}" for m in members)
    try:
        for member in members:
            member.initial_cluster = initial
            member.launch()
        for member in members:
            member.wait_healthy(timeout_s)
    except BaseException:
        for member in members:
            member.kill()
        raise
    return members


def endpoints(members: Sequence[EtcdProcess]) -> str:
    """The `etcd.endpoint` setting naming every member."""
    return ",".join(member.endpoint for member in members)
