"""BrokerProcess: a broker run as a child process, for tests, benchmarks and the demo job
(ChildProcess: what it shares with the etcd child of a local cluster, broker/cluster/etcd_process.py).

It runs `python -m broker.cli broker start [--config FILE] -o key=value ...`, waits for the
"listening on HOST:PORT" line to learn the port (port 0 by default, so any number of brokers can
run side by side), and stops the child by PID: SIGTERM for a clean stop, SIGKILL for a crash. The
child gets SIGKILL if its parent dies (Linux PR_SET_PDEATHSIG), so no test or benchmark leaves a
broker behind. Its output goes to a file so a failure can show it.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Mapping

READY = re.compile(r"listening on ([\d.]+):(\d+)")
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the kernel SIGKILLs the child when the parent dies (Linux only; no-op elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ChildProcess:
    """A child process stopped by PID: `proc` while it runs, its output in the file `output`."""

    what = "process"
    stop_timeout_s = 30.0
    proc: "subprocess.Popen[Any] | None"
    output: Path

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.what} not started"
        return self.proc.pid

    def stop(self, timeout_s: float | None = None) -> int:
        """Clean stop (SIGTERM), SIGKILL after `timeout_s`; returns the exit code."""
        return stop_all([self], timeout_s)[0]

    def pause(self) -> None:
        """Hang: SIGSTOP (the process keeps its sockets but answers nothing); `resume` continues it."""
        assert self.proc is not None, f"{self.what} not started"
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None, f"{self.what} not started"
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """Crash: SIGKILL, no chance to flush or checkpoint."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.output.read_text(errors="replace")[-chars:]
        return ""

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def stop_all(processes: "list[ChildProcess]", timeout_s: float | None = None) -> list[int]:
    """Stop several processes cleanly at once: SIGTERM to every one, then wait for each, and
    SIGKILL those still running `timeout_s` (default: each one's `stop_timeout_s`) after the
    signal. Returns the exit codes (0 for a process not running). At once, so that stopping N
    processes takes as long as the slowest, not the sum."""
    running = []
    for process in processes:
        proc, process.proc = process.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        running.append((process, proc))
    codes = []
    start = time.monotonic()
    for process, proc in running:
        if proc is None:
            codes.append(0)
            continue
        limit = process.stop_timeout_s if timeout_s is None else timeout_s
        try:
            codes.append(proc.wait(max(0.0, start + limit - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


class BrokerProcess(ChildProcess):
    """One broker child process. `overrides` are broker configs (`log.dir` defaults to `log_dir`).

    Restarting with `start()` after `stop()`/`kill()` reuses the learned port, so clients that
    were connected can reconnect to the same address.
    """

    def __init__(self, log_dir: Path, overrides: Mapping[str, Any] | None = None, *,
                 config_file: Path | None = None, output: Path | None = None, cwd: Path | None = None,
                 module: str = "broker.cli", env: Mapping[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        # Free ports (the broker's and its metrics endpoint's) unless asked otherwise: a config file
        # (conf/broker.toml, which `broker start` reads from the working directory) names fixed ones.
        self.overrides: dict[str, Any] = {"port": 0, "metrics.port": 0, "log.dir": str(self.log_dir),
                                          **(overrides or {})}
        self.config_file = config_file
        self.output = output or self.log_dir.parent / f"{self.log_dir.name}.out"
        self.cwd = cwd
        self.module = module  # a test may run the broker under a wrapper module (fault injection)
        self.env = dict(env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.host = str(self.overrides.get("host", "127.0.0.1"))

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BrokerProcess":
        """Start the child and wait until it listens; RuntimeError with its output if it does not."""
        if self.port is not None:
            self.overrides["port"] = self.port
        args = [sys.executable, "-m", self.module, "broker", "start"]
        if self.config_file is not None:
            args += ["--config", str(self.config_file)]
        for key, value in self.overrides.items():
            args += ["-o", f"{key}={value}"]
        self.output.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.output, "a")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=out, text=True, cwd=self.cwd,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env}, preexec_fn=die_with_parent)
        found: list[int] = []
        proc = self.proc

        def copy_stdout() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                out.flush()
                match = READY.search(line)
                if match and not found:
                    self.host = match.group(1)
                    found.append(int(match.group(2)))

        threading.Thread(target=copy_stdout, name="broker-stdout", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker did not start; output:\n{self.log_tail()}")
            time.sleep(0.02)
        self.port = found[0]
        return self

    def metrics(self) -> dict[str, float]:
        """The broker's Prometheus metrics (it must run with `metrics.port`), `name{labels}` -> value."""
        ports = re.findall(r"metrics on http://[^:]+:(\d+)/metrics", self.log_tail(200_000))
        if not ports:
            raise RuntimeError(f"the broker serves no metrics (metrics.port unset?); output:\n{self.log_tail()}")
        with urllib.request.urlopen(f"http://{self.host}:{ports[-1]}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def __enter__(self) -> "BrokerProcess":
        return self.start()
