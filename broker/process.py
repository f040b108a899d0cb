"""BrokerProcess: a broker run as a child process, for tests, benchmarks and the demo job
(common/child_process.py: what it shares with etcd and Spark's daemons).

It runs `python -m cli broker start [--config FILE] -o key=value ...` and waits for the
"listening on HOST:PORT" line to learn the port (port 0 by default, so any number of brokers can
run side by side).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Mapping

from common.child_process import ChildProcess, die_with_parent

READY = re.compile(r"listening on ([\d.]+):(\d+)")


class BrokerProcess(ChildProcess):
    """One broker child process. `overrides` are broker configs (`log.dir` defaults to `log_dir`).

    Restarting with `start()` after `stop()`/`kill()` reuses the learned port, so clients that
    were connected can reconnect to the same address.
    """

    def __init__(self, log_dir: Path, overrides: Mapping[str, Any] | None = None, *,
                 config_file: Path | None = None, output: Path | None = None, cwd: Path | None = None,
                 module: str = "cli", env: Mapping[str, str] | None = None) -> None:
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
