"""Shared fixtures: real broker processes on loopback, stopped by PID in teardown."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

READY = re.compile(r"listening on ([\d.]+):(\d+)")


class BrokerProcess:
    """A broker started as `python -m broker.cli broker start` with config overrides.

    `start()` waits for the readiness line and learns the port (the broker binds port 0 unless
    told otherwise, so restarts keep their port by passing it back). Output goes to a log file in
    the data dir so a failing test can show it.
    """

    def __init__(self, log_dir: Path, **overrides: object) -> None:
        self.log_dir = log_dir
        self.overrides: dict[str, object] = {"port": 0, "log.dir": str(log_dir), **overrides}
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.output = log_dir.parent / f"{log_dir.name}.out"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BrokerProcess":
        if self.port is not None:
            self.overrides["port"] = self.port  # restart on the same port
        args = [sys.executable, "-m", "broker.cli", "broker", "start"]
        for key, value in self.overrides.items():
            args += ["-o", f"{key}={value}"]
        out = open(self.output, "a")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=out, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        found: list[int] = []

        def read_ready() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                match = READY.search(line)
                if match and not found:
                    found.append(int(match.group(2)))

        threading.Thread(target=read_ready, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker did not start; output:\n{self.output.read_text()[-4000:]}")
            time.sleep(0.05)
        self.port = found[0]
        return self

    def stop(self, timeout_s: float = 20.0) -> int:
        """Clean stop (SIGTERM), escalating to SIGKILL; returns the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        """Crash: SIGKILL, no chance to flush or checkpoint."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Make brokers in tmp_path; every one still running at teardown is killed by PID."""
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **overrides: object) -> BrokerProcess:
        process = BrokerProcess(tmp_path / name, **overrides)
        started.append(process)
        return process

    yield make
    for process in started:
        process.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """One running broker with default settings."""
    return broker_factory().start()
