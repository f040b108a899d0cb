"""Benchmark harness: broker processes, worker processes, RSS / CPU sampling, profiling, results.

Everything here is self-contained (no pytest): a broker is started exactly like
`tests/conftest.py` does it (`python -m cli broker start -o key=value ...`, port learned
from the "listening on" line), in a temporary data directory that is removed afterwards. Every
broker and worker this module starts is remembered and killed by PID at interpreter exit, on
Ctrl-C and on SIGTERM; brokers also get PR_SET_PDEATHSIG so they die with the harness even if it
is SIGKILLed.

Clients run in separate processes (`multiprocessing` with the spawn start method): one producer
process, one consumer process, one broker process, as the targets in the README require.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from broker import process
from common.child_process import die_with_parent

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"
PROFILES_DIR = RESULTS_DIR / "profiles"
DEFAULT_BROKER_CONFIG = REPO / "conf" / "broker.toml"
MB = 1 << 20
GB = 1 << 30
KB = 1 << 10

_SPAWN = mp.get_context("spawn")
_live_brokers: dict[int, "BrokerProcess"] = {}
_live_workers: dict[int, "Worker"] = {}
_live_profilers: dict[int, subprocess.Popen] = {}
_temp_dirs: list[Path] = []
_cleanup_lock = threading.Lock()


# -- cleanup -----------------------------------------------------------------------------------


def cleanup() -> None:
    """Kill every process this harness started (by PID) and remove its temporary directories."""
    with _cleanup_lock:
        for proc in list(_live_profilers.values()):
            with contextlib.suppress(Exception):
                proc.send_signal(signal.SIGINT)
                proc.wait(5)
        _live_profilers.clear()
        for worker in list(_live_workers.values()):
            with contextlib.suppress(Exception):
                worker.kill()
        for broker in list(_live_brokers.values()):
            with contextlib.suppress(Exception):
                broker.kill()
        for path in _temp_dirs:
            shutil.rmtree(path, ignore_errors=True)
        _temp_dirs.clear()


def _on_signal(signum: int, frame: Any) -> None:
    cleanup()
    # Re-raise as the usual exception so `finally` blocks and the exit code behave normally.
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Kill started processes at exit, on Ctrl-C and on SIGTERM. Call from the main process only."""
    if mp.current_process().name != "MainProcess":
        return
    atexit.register(cleanup)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def make_temp_dir(prefix: str = "pymq-bench-", root: str | Path | None = None) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    _temp_dirs.append(path)
    return path


def remove_temp_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(ValueError):
        _temp_dirs.remove(path)


# -- /proc sampling ----------------------------------------------------------------------------


def rss_kb(pid: int) -> int | None:
    """VmRSS of `pid` in KiB, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def hwm_kb(pid: int) -> int | None:
    """VmHWM (peak RSS) of `pid` in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used (all threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def machine_busy_seconds() -> float:
    """CPU seconds all cores of this machine spent busy (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


@contextlib.contextmanager
def cpu_hog(processes: int | None = None) -> Any:
    """One process spinning per core (default) while the block runs: the machine as loaded as a
    busy neighbour leaves it. Stopped by PID on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes or os.cpu_count() or 1)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def dirty_mb() -> float:
    """Dirty + Writeback page cache (MiB): data written but not yet on disk."""
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(("Dirty:", "Writeback:")):
                total += int(line.split()[1])
    return total / 1024


def wait_for_writeback(max_mb: float = 256.0, max_wait_s: float = 120.0) -> float:
    """Wait until earlier runs' dirty pages are mostly on disk, so one run's writeback does not
    throttle the next one's writes (buffered writes on this VM sustain only ~330 MB/s once the
    kernel's dirty limits are reached). Returns the dirty MiB at the start."""
    deadline = time.monotonic() + max_wait_s
    while True:
        dirty = dirty_mb()
        if dirty <= max_mb or time.monotonic() > deadline:
            return round(dirty, 1)
        time.sleep(0.5)


def wait_for_quiet(max_wait_s: float | None = None, threshold_pct: float | None = None, window_s: float = 1.0) -> float:
    """Wait (up to `max_wait_s`, env PYMQ_BENCH_QUIET_WAIT_S, default 120) until the machine uses
    less than `threshold_pct` (env PYMQ_BENCH_QUIET_PCT, default 20) of one core over `window_s`;
    returns the last measured load (% of one core). Other test runs on a 2-core machine would
    otherwise distort every number; the load during each run is recorded as other_cpu_pct."""
    if max_wait_s is None:
        max_wait_s = float(os.environ.get("PYMQ_BENCH_QUIET_WAIT_S", "120"))
    if threshold_pct is None:
        threshold_pct = float(os.environ.get("PYMQ_BENCH_QUIET_PCT", "20"))
    wait_for_writeback()
    deadline = time.monotonic() + max_wait_s
    while True:
        before = machine_busy_seconds()
        time.sleep(window_s)
        load = 100 * (machine_busy_seconds() - before) / window_s
        if load < threshold_pct or time.monotonic() > deadline:
            if load >= threshold_pct:
                print(f"  (machine still busy: {load:.0f}% of a core used by other processes; measuring anyway)", flush=True)
            return round(load, 1)
        print(f"  waiting for a quiet machine: {load:.0f}% of a core busy", flush=True)


class CpuMeter:
    """CPU seconds used by a set of processes between `start()` and `stop()` (as % of one core),
    plus `machine_cpu_pct` (every process on the machine) and `other_cpu_pct` (the difference:
    processes that are not part of the benchmark; 200% = both cores)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float | None] = {}
        self._t0 = 0.0
        self.result: dict[str, float] = {}

    def add(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        self._start[name] = cpu_seconds(pid)

    def start(self) -> "CpuMeter":
        self._t0 = time.perf_counter()
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._start["__self__"] = time.process_time()
        self._machine0 = machine_busy_seconds()
        return self

    def stop(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        machine = machine_busy_seconds() - self._machine0
        out = {}
        ours = time.process_time() - (self._start.get("__self__") or 0.0)
        for name, pid in self.pids.items():
            before, after = self._start.get(name), cpu_seconds(pid)
            if before is not None and after is not None:
                out[f"{name}_cpu_pct"] = round(100 * (after - before) / wall, 1)
                ours += after - before
        out["machine_cpu_pct"] = round(100 * machine / wall, 1)
        out["other_cpu_pct"] = round(max(0.0, 100 * (machine - ours) / wall), 1)
        self.result = out
        return out


class WindowMeter:
    """Used inside a worker process around its timed section: CPU of this process (`own`), of
    the broker, of the whole machine and of everything else (% of one core; 200% = both cores)."""

    def __init__(self, own: str, broker_pid: int | None = None, extra_pids: dict[str, int] | None = None) -> None:
        self.own = own
        self.pids = {"broker": broker_pid} if broker_pid else {}
        self.pids.update(extra_pids or {})

    def start(self) -> "WindowMeter":
        self._cpu0 = time.process_time()
        self._pids0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine0 = machine_busy_seconds()
        self._dirty0 = dirty_mb()
        return self

    def stop(self, elapsed_s: float) -> dict[str, float]:
        elapsed_s = max(elapsed_s, 1e-9)
        own = time.process_time() - self._cpu0
        out = {f"{self.own}_cpu_pct": round(100 * own / elapsed_s, 1)}
        ours = own
        for name, pid in self.pids.items():
            before, after = self._pids0.get(name), cpu_seconds(pid)
            if before is not None and after is not None:
                out[f"{name}_cpu_pct"] = round(100 * (after - before) / elapsed_s, 1)
                ours += after - before
        machine = machine_busy_seconds() - self._machine0
        out["machine_cpu_pct"] = round(100 * machine / elapsed_s, 1)
        out["other_cpu_pct"] = round(max(0.0, 100 * (machine - ours) / elapsed_s), 1)
        out["dirty_mb_at_start"] = round(self._dirty0, 1)
        return out


class RssSampler:
    """Samples VmRSS of `pid` every `interval_s` on a thread; optional extra probes (e.g. disk use)."""

    def __init__(self, pid: int, interval_s: float = 0.5, probes: dict[str, Callable[[], float]] | None = None) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.probes = probes or {}
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._t0 = 0.0

    def start(self) -> "RssSampler":
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            value = rss_kb(self.pid)
            if value is None:
                break
            sample = {"t_s": round(time.perf_counter() - self._t0, 2), "rss_mb": round(value / 1024, 1)}
            for name, probe in self.probes.items():
                with contextlib.suppress(Exception):
                    sample[name] = probe()
            self.samples.append(sample)
            self._stop.wait(self.interval_s)

    def stop(self) -> list[dict[str, float]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples

    @property
    def max_rss_mb(self) -> float:
        return max((s["rss_mb"] for s in self.samples), default=0.0)


def dir_size_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


# -- broker processes --------------------------------------------------------------------------


class BrokerProcess(process.BrokerProcess):
    """broker.process.BrokerProcess in a harness-owned temporary data directory (unless `data_dir`
    is given: pass the same directory to a second one to restart on existing data, e.g. with another
    event loop), registered so that `cleanup` kills it on exit, Ctrl-C or SIGTERM."""

    def __init__(self, overrides: dict[str, Any] | None = None, data_dir: Path | None = None,
                 config_file: Path | None = DEFAULT_BROKER_CONFIG, name: str = "broker",
                 temp_root: str | Path | None = None) -> None:
        self.data_dir = data_dir if data_dir is not None else make_temp_dir(root=temp_root)
        self.name = name
        super().__init__(self.data_dir / "log", overrides,
                         config_file=config_file if config_file is not None and Path(config_file).is_file() else None,
                         output=self.data_dir / f"{name}.out", cwd=REPO)

    def start(self, timeout_s: float = 60.0) -> "BrokerProcess":
        super().start(timeout_s)
        _live_brokers[self.pid] = self
        return self

    def stop(self, timeout_s: float = 30.0) -> int:
        pid = self.proc.pid if self.proc is not None else None
        code = super().stop(timeout_s)
        _live_brokers.pop(pid, None)
        return code

    def kill(self) -> None:
        pid = self.proc.pid if self.proc is not None else None
        super().kill()
        _live_brokers.pop(pid, None)

    def rss_mb(self) -> float | None:
        value = rss_kb(self.pid) if self.proc is not None else None
        return None if value is None else value / 1024


def broker_overrides(event_loop: str = "uvloop", **extra: Any) -> dict[str, Any]:
    """Common broker overrides for benchmarks: the event loop plus anything given (dots as `__`)."""
    out: dict[str, Any] = {"event.loop": event_loop}
    out.update({k.replace("__", "."): v for k, v in extra.items()})
    return out


# -- admin helpers (run in the harness process) ------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict[str, Any] | None = None) -> None:
    from client import Admin

    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, configs=configs or {})


def delete_topic(bootstrap: str, name: str) -> None:
    from client import Admin

    with Admin(bootstrap) as admin:
        admin.delete_topics([name])


def topic_end_offsets(bootstrap: str, name: str, partitions: int) -> dict[int, int]:
    from client import Admin
    from client.admin import LATEST

    with Admin(bootstrap) as admin:
        found = admin.list_offsets({(name, p): LATEST for p in range(partitions)})
    return {p: off for (_, p), (off, _) in found.items()}


# -- worker processes --------------------------------------------------------------------------


def _worker_main(target: Callable[..., Any], kwargs: dict[str, Any], results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness stops workers; Ctrl-C goes to it
    try:
        results.put(("ok", target(**kwargs)))
    except BaseException as err:  # noqa: BLE001 - report everything to the harness
        results.put(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class Worker:
    """A client workload in its own (spawned) process. `target` must be a module-level function."""

    def __init__(self, target: Callable[..., Any], name: str = "worker", **kwargs: Any) -> None:
        self.name = name
        self._results = _SPAWN.Queue()
        self.process = _SPAWN.Process(target=_worker_main, args=(target, kwargs, self._results), name=name, daemon=True)

    def start(self) -> "Worker":
        self.process.start()
        assert self.process.pid is not None
        _live_workers[self.process.pid] = self
        return self

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def result(self, timeout_s: float | None = None, on_wait: Callable[[], None] | None = None) -> Any:
        """Wait for the workload's return value; raises RuntimeError if it failed or timed out.
        `on_wait` is called about every 0.5 s while waiting (progress reports)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                status, value = self._results.get(timeout=0.5)
                break
            except Exception:  # queue.Empty
                if on_wait is not None:
                    on_wait()
                if not self.process.is_alive():
                    try:
                        status, value = self._results.get(timeout=2)
                        break
                    except Exception:
                        self._forget()
                        raise RuntimeError(f"{self.name} died with exit code {self.process.exitcode}") from None
                if deadline is not None and time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"{self.name} did not finish within {timeout_s}s") from None
        self.process.join(30)
        if self.process.is_alive():
            self.kill()
        self._forget()
        if status != "ok":
            raise RuntimeError(f"{self.name} failed: {value}")
        return value

    def _forget(self) -> None:
        if self.process.pid is not None:
            _live_workers.pop(self.process.pid, None)

    def kill(self) -> None:
        if self.process.pid is not None and self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(10)
        self._forget()


def run_worker(target: Callable[..., Any], name: str = "worker", timeout_s: float | None = 900, **kwargs: Any) -> Any:
    return Worker(target, name, **kwargs).start().result(timeout_s)


def new_event() -> Any:
    """An Event that can be passed to a spawned Worker."""
    return _SPAWN.Event()


# -- payloads (used inside worker processes) ---------------------------------------------------

SPREAD = 4096


def payload_buffer(record_size: int, rows: int, seed: int = 7) -> Any:
    """Random uppercase letters (as kafka-producer-perf-test), enough for `rows` values + a spread."""
    import numpy as np
    import pyarrow as pa

    letters = np.random.default_rng(seed).integers(ord("A"), ord("Z") + 1, record_size * rows + SPREAD, dtype=np.uint8)
    return pa.py_buffer(letters)


def value_table(buffer: Any, record_size: int, rows: int, variant: int = 0) -> Any:
    """A one-column `value` table of `rows` values referencing `buffer` zero-copy."""
    import numpy as np
    import pyarrow as pa

    start = variant * 7 % SPREAD
    offsets = np.arange(rows + 1, dtype=np.int32) * record_size + start
    values = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), buffer])
    return pa.table({"value": values})


def value_list(record_size: int, count: int = 1024, seed: int = 7) -> list[bytes]:
    """`count` distinct bytes values of `record_size` bytes for the per-record path."""
    buffer = memoryview(payload_buffer(record_size, 1, seed))
    return [bytes(buffer[(i * 7) % SPREAD: (i * 7) % SPREAD + record_size]) for i in range(count)]


def warm_up_arrow() -> None:
    """First UTC timestamp cast loads Arrow's tz database (~200 ms): pay it before the clock."""
    import pyarrow as pa

    from segment_format import batch_body

    pa.array([0], pa.int64()).cast(batch_body.TIMESTAMP_TYPE)


# -- latency statistics ------------------------------------------------------------------------


def percentiles(values_ms: Any) -> dict[str, float]:
    import numpy as np

    arr = np.asarray(values_ms, dtype=np.float64)
    if not len(arr):
        return {"count": 0}
    q = np.percentile(arr, [50, 90, 99, 99.9])
    return {"count": int(len(arr)), "avg_ms": round(float(arr.mean()), 3), "p50_ms": round(float(q[0]), 3),
            "p90_ms": round(float(q[1]), 3), "p99_ms": round(float(q[2]), 3), "p99_9_ms": round(float(q[3]), 3),
            "max_ms": round(float(arr.max()), 3)}


# -- profiling with py-spy ---------------------------------------------------------------------

PY_SPY = Path(sys.executable).parent / "py-spy"


class Profiler:
    """py-spy `record --format raw` attached to named PIDs until `stop()` (or the process exits)."""

    def __init__(self, out_dir: Path, rate: int = 200, tag: str = "") -> None:
        self.out_dir = out_dir
        self.rate = rate
        self.tag = tag
        self.procs: dict[str, tuple[subprocess.Popen, Path, float]] = {}
        out_dir.mkdir(parents=True, exist_ok=True)

    def attach(self, name: str, pid: int, duration_s: float | None = None) -> Path:
        path = self.out_dir / f"{self.tag}{name}.txt"
        args = [str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "--threads", "--rate", str(self.rate),
                "-o", str(path)]
        if duration_s is not None:
            args += ["--duration", str(int(duration_s))]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent)
        _live_profilers[proc.pid] = proc
        self.procs[name] = (proc, path, time.perf_counter())
        return path

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every recorder (SIGINT by PID makes py-spy write its file) and summarize each."""
        out: dict[str, dict[str, Any]] = {}
        for name, (proc, path, started) in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                _, err = proc.communicate()
            _live_profilers.pop(proc.pid, None)
            wall = time.perf_counter() - started
            if path.exists():
                out[name] = summarize_raw(path, self.rate, wall)
                out[name]["raw_file"] = str(path)
            else:
                out[name] = {"error": (err or "")[-2000:]}
        self.procs.clear()
        return out


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
# Leaf frames where a thread waits. py-spy's idle detection lets many of these through on this
# kernel (a --native check shows epoll_pwait under them), so they are set apart: the event-loop
# lines mix epoll waiting with real work inside uvloop's C code (socket reads and writes,
# callbacks' C parts), which py-spy cannot tell apart without --native.
_LOOP_LEAVES = re.compile(r"^(LoopThread\._run \(client/loop_thread\.py|Runner\.run \(asyncio/runners\.py"
                          r"|run_forever \(asyncio/base_events\.py)")
_WAIT_LEAVES = re.compile(r"^(\w+\.)?(select \(selectors\.py|wait \(threading\.py|wait \(multiprocessing/"
                          r"|_worker \(concurrent/futures/thread\.py|_wait_for_tstate_lock \(|get \(queue\.py)")


def _leaf_kind(frame: str) -> str:
    if _LOOP_LEAVES.match(frame):
        return "loop"
    if _WAIT_LEAVES.match(frame):
        return "wait"
    return "work"


def _split_frames(stack: str) -> list[str]:
    # Frames are "func (file:line)" joined by ';'. A frame never contains ';' in practice.
    return stack.split(";")


def summarize_raw(path: Path, rate: int, wall_s: float, top: int = 12) -> dict[str, Any]:
    """Self and inclusive time per function (and the hottest line of each) from py-spy raw output.

    `pct` is of the process's *work* samples: every sample py-spy took (all threads) except those
    whose leaf is a wait (thread-pool queue, Condition/Event wait, selectors.select) or the event
    loop's run_forever line (epoll wait mixed with uvloop C work; reported as `loop_pct` of all
    samples). `approx_cores_busy` = work samples / (wall seconds x rate).
    """
    self_fn: Counter[str] = Counter()
    self_line: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    lines_of: dict[str, Counter[str]] = defaultdict(Counter)
    kinds: Counter[str] = Counter()
    total = 0
    for raw in path.read_text().splitlines():
        stack, _, count_text = raw.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = _split_frames(stack)
        thread_name = "?"
        if frames[0].startswith("thread ("):
            thread_name = frames[0].split(": ", 1)[-1]
            frames = frames[1:]
        if not frames:
            continue
        kind = _leaf_kind(frames[-1])
        kinds[kind] += count
        if kind != "work":
            continue
        threads[thread_name] += count
        total += count
        seen: set[str] = set()
        for frame in frames:
            fn = _function_of(frame)
            if fn not in seen:
                incl_fn[fn] += count
                seen.add(fn)
        leaf = frames[-1]
        fn = _function_of(leaf)
        self_fn[fn] += count
        self_line[leaf] += count
        lines_of[fn][leaf] += count

    def pct(n: int) -> float:
        return round(100 * n / total, 1) if total else 0.0

    everything = sum(kinds.values())
    return {
        "samples": total,
        "all_samples": everything,
        "loop_pct": round(100 * kinds["loop"] / everything, 1) if everything else 0.0,
        "wait_pct": round(100 * kinds["wait"] / everything, 1) if everything else 0.0,
        "rate_hz": rate,
        "wall_s": round(wall_s, 1),
        "approx_cores_busy": round(total / max(wall_s * rate, 1e-9), 2),
        "threads": {name: pct(n) for name, n in threads.most_common()},
        "self": [{"function": fn, "pct": pct(n), "hottest_line": lines_of[fn].most_common(1)[0][0],
                  "hottest_line_pct": pct(lines_of[fn].most_common(1)[0][1])}
                 for fn, n in self_fn.most_common(top)],
        "self_lines": [{"frame": frame, "pct": pct(n)} for frame, n in self_line.most_common(top)],
        "inclusive": [{"function": fn, "pct": pct(n)} for fn, n in incl_fn.most_common(top * 2)],
    }


def _function_of(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (path/file.py)'."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    return f"{match.group('func')} ({match.group('file')})"


# -- results -----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import pyarrow

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / (1 << 20), 1)
    git: dict[str, Any] = {}
    if os.environ.get("PYMQ_BENCH_SOURCE_COMMIT"):  # running from an exported snapshot of a commit
        git = {"commit": os.environ["PYMQ_BENCH_SOURCE_COMMIT"], "broker_dirty_files": [], "snapshot": str(REPO)}
    else:
        with contextlib.suppress(Exception):
            git["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--", "broker"], cwd=REPO, capture_output=True,
                                   text=True, timeout=10).stdout.split("\n")
            git["broker_dirty_files"] = [line[3:] for line in dirty if line.strip()]
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gb": mem_gb, "kernel": platform.release(),
            "python": platform.python_version(), "pyarrow": pyarrow.__version__, "git": git}


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "date": _dt.date.today().isoformat(), "run_at": _dt.datetime.now().isoformat(timespec="seconds"),
               "machine": machine_info(), **data}
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def load_results(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def print_table(title: str, rows: list[dict[str, Any]], columns: Iterable[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if not rows:
        return
    columns = list(columns or rows[0].keys())
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if isinstance(rows[0].get(col), (int, float)) else "left")
    for row in rows:
        table.add_row(*(_fmt(row.get(col)) for col in columns))
    Console(width=220).print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass
class SummaryRow:
    """One line of the README results table."""

    benchmark: str
    target: str
    measured: str
    met: bool | None
    notes: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "target": self.target, "measured": self.measured,
                "met": self.met, "notes": self.notes}


def markdown_table(rows: list[SummaryRow]) -> str:
    out = ["| benchmark | target | measured | met? | notes |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        met = "yes" if row.met else "no" if row.met is not None else "n/a"
        out.append(f"| {row.benchmark} | {row.target} | {row.measured} | {met} | {row.notes} |")
    return "\n".join(out)


def rate(records: float) -> str:
    """1234567 -> '1.23 M msg/s'."""
    if records >= 1e6:
        return f"{records / 1e6:.2f} M msg/s"
    return f"{records / 1e3:.0f} k msg/s"


def scaled(value: int, quick: bool, factor: int = 20, minimum: int = 1) -> int:
    return max(minimum, value // factor) if quick else value
