"""BrokerProcess: a broker run as a child process, for tests, benchmarks and the demo job
(common/child_process.py: what it shares with etcd and Spark's daemons).

It runs `python -m cli broker start [--config FILE] -o key=value ...` and waits for the
"listening on HOST:PORT" line to learn the port (port 0 by default, so any number of brokers can
run side by side).
"""
from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar, Mapping

from common.child_process import ChildProcess, Launcher, ProcessHandle, launch_interpreter

READY = re.compile(r"listening on ([\d.]+):(\d+)")


class BrokerProcess(ChildProcess):
    """One broker child process. `overrides` are broker configs (`log.dir` defaults to `log_dir`).

    Restarting with `start()` after `stop()`/`kill()` reuses the learned port, so clients that
    were connected can reconnect to the same address. `launcher` starts it: a new interpreter,
    as a user's command line does, unless the test suite installs its forkserver (hundreds of
    brokers, each spared importing the broker again).
    """

    launcher: ClassVar[Launcher] = staticmethod(launch_interpreter)

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
        self.proc: ProcessHandle | None = None
        self.port: int | None = None
        self.host = str(self.overrides.get("host", "127.0.0.1"))

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BrokerProcess":
        """Start the child and wait until it listens; RuntimeError with its output if it does not."""
        if self.port is not None:
            self.overrides["port"] = self.port
        argv = ["broker", "start"]
        if self.config_file is not None:
            argv += ["--config", str(self.config_file)]
        for key, value in self.overrides.items():
            argv += ["-o", f"{key}={value}"]
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.output.touch()
        with open(self.output, "rb") as out:
            out.seek(0, os.SEEK_END)  # a restart appends: only its own lines count
            self.proc = proc = self.launcher(self.module, argv, cwd=self.cwd, output=self.output,
                                             env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
            deadline = time.monotonic() + timeout_s
            said = b""
            while not (match := READY.search(said.decode(errors="replace"))):
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"broker did not start; output:\n{self.log_tail()}")
                time.sleep(0.01)
                said += out.read()
        self.host, self.port = match.group(1), int(match.group(2))
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
