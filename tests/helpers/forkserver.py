"""A Launcher (common/child_process.py) that forks brokers from a server that imported the broker
once, instead of starting a new interpreter for each.

The suite starts some 350 brokers. A new interpreter spends about 0.5 s of CPU importing the
broker (numpy, pyarrow, the protocol's messages) before it listens: three minutes of the two
cores' time per run. multiprocessing's forkserver keeps one interpreter per test worker with
those modules imported, and each broker is a fork of it, running the same `python -m MODULE
ARGV` code path (`runpy`, as `-m` does) in the asked-for directory and environment, its output
appended to the same file.

What differs from a new interpreter, and why it does not matter to a broker:
- The modules imported in the server are imported once, before the test's environment is set:
  no module the broker imports reads the environment at import (a fault-injection wrapper
  module is not pre-imported, so it reads it in the fork).
- pyarrow's jemalloc and numpy's BLAS each start a thread at import, so the server forks with
  threads running: both libraries register fork handlers for exactly this.
- The broker is the server's child, not the test's: the handle below waits through
  multiprocessing's sentinel and exit status, and signals go by PID as before. It dies with the
  server, and the server with the test worker.
"""
from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from common.child_process import die_with_parent

PRELOAD = ["cli", "broker.server", "uvloop", "encodings.idna"]  # what a running broker has imported
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


class ForkedProcess:
    """A forked broker, with the `subprocess.Popen` names ChildProcess uses (ProcessHandle)."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        assert process.pid is not None
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self._process.kill()


def launch_forked(module: str, argv: list[str], *, cwd: Path | None, env: Mapping[str, str],
                  output: Path) -> ForkedProcess:
    """The Launcher: `python -m module argv...`, forked from the preloaded server."""
    process = _context.Process(target=_run, args=(module, argv, str(cwd) if cwd else None, dict(env), str(output)),
                               name=f"{module} {' '.join(argv[:2])}", daemon=False)
    process.start()
    return ForkedProcess(process)


def _run(module: str, argv: list[str], cwd: str | None, env: dict[str, str], output: str) -> None:
    """In the fork: become `python -m module argv...` as launch_interpreter starts it."""
    die_with_parent()
    fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # line-buffered, as PYTHONUNBUFFERED
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    if cwd is not None:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
