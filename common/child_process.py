"""ChildProcess: a child process (a broker, etcd, a Spark daemon) stopped by PID, that dies with its parent.

Tests, benchmarks, the demo job and a local cluster start brokers, etcd and Spark's standalone
daemons as children. Each is stopped by PID (SIGTERM for a clean stop, SIGKILL for a crash) and
gets SIGKILL if its parent dies (Linux PR_SET_PDEATHSIG), so no test or benchmark leaves one
behind. Its output goes to a file so a failure can show it.
"""
from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

_PR_SET_PDEATHSIG = 1


class ProcessHandle(Protocol):
    """What a ChildProcess needs of its running process: `subprocess.Popen`'s names, so a Popen
    is one; a process forked by a server of pre-imported interpreters (the tests' brokers,
    tests/helpers/forkserver.py) is another."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts `python -m MODULE ARGV...` in `cwd` with exactly `env`, its stdout and stderr
    appended to `output`, dying with its parent."""

    def __call__(self, module: str, argv: list[str], *, cwd: Path | None, env: Mapping[str, str],
                 output: Path) -> ProcessHandle: ...


def launch_interpreter(module: str, argv: list[str], *, cwd: Path | None, env: Mapping[str, str],
                       output: Path) -> "subprocess.Popen[bytes]":
    """The Launcher a user's command line is: a new interpreter."""
    with open(output, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", module, *argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd, env=dict(env), preexec_fn=die_with_parent)


def die_with_parent() -> None:
    """preexec_fn: the kernel SIGKILLs the child when the parent dies (Linux only; no-op elsewhere)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ChildProcess:
    """A child process stopped by PID: `proc` while it runs, its output in the file `output`."""

    what = "process"
    stop_timeout_s = 30.0
    proc: ProcessHandle | None
    output: Path

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.what} not started"
        return self.proc.pid

    def stop(self, timeout_s: float | None = None) -> int:
        """Clean stop (SIGTERM), SIGKILL after `timeout_s`; returns the exit code."""
        return stop_all([self], timeout_s)[0]

    def pause(self, timeout_s: float = 5.0) -> None:
        """Hang: SIGSTOP (the process keeps its sockets but answers nothing); `resume` continues it.
        Returns once every thread has stopped: kill() returns before a thread running on another
        core stops, and such a thread could still answer a request sent right after."""
        assert self.proc is not None, f"{self.what} not started"
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and not _all_threads_stopped(self.proc.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.what} (pid {self.proc.pid}) did not stop within {timeout_s} s of SIGSTOP")
            time.sleep(0.001)

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


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state ("T" in /proc/PID/task/TID/stat)."""
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            stat = (task / "stat").read_text()
            if stat[stat.rindex(")") + 2] not in "tT":
                return False
    except (FileNotFoundError, ProcessLookupError):
        return False
    return True
