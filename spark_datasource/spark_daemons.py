"""Spark's own daemons, run locally from the installed pyspark: a standalone cluster (a Master and
a Worker JVM, `bin/spark-class`) and a Spark Connect server (`bin/spark-submit --class
SparkConnectServer`), for the tests and benchmarks that run `format("pymq")` on a cluster and
over Spark Connect.

Each daemon is a ChildProcess (broker/process.py): started on 127.0.0.1 with port 0 (Spark binds
a free port and logs it; the port is read back from that line), its log in a file, stopped by
PID, SIGKILLed if its parent dies. `bin/spark-class` ends in `exec java`, so the PID is the JVM's.

What the environment gives them is what a real deployment must give its executors as well
(docs/spark.md, "Running on a cluster"): `PYSPARK_PYTHON`, an interpreter that imports pymq;
`PYTHONPATH` with this checkout first, so that a source checkout's code is what executors run;
`SPARK_LOCAL_IP`, loopback; `SPARK_CONF_DIR`, pyspark's own (pip's pyspark ships none), so a
`SPARK_CONF_DIR` set for another Spark applies no stray spark-defaults.conf.

Every JVM here maps the class archive a local session maps (spark_datasource/class_archive.py,
when `make venv` built it): the archive fits a JVM whose classpath is the one it was made with, and
with pyspark's conf folder in front, the Master's, the Worker's, their executors' and every
spark-submit's classpath is the local session's.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

import pyspark

from common.child_process import ChildProcess, die_with_parent, stop_all
from spark_datasource import class_archive, jars

SPARK_HOME = Path(pyspark.__file__).resolve().parent
REPO = Path(__file__).resolve().parent.parent
SPARK_DEFAULTS = REPO / "conf" / "spark-defaults.conf"
LOG4J = REPO / "conf" / "log4j2.properties"  # warnings and errors only: for drivers, not the daemons (their ready lines are INFO)
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_READY = re.compile(r"Starting Spark master at (spark://[\d.]+:\d+)")
WORKER_READY = re.compile(r"Successfully registered with master (spark://\S+)")
CONNECT_READY = re.compile(r"Spark Connect server started at: ([\d.]+):(\d+)")


def spark_env() -> dict[str, str]:
    """The environment of every Spark JVM started here (and of the executors their Worker starts)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_CONF_DIR": str(SPARK_HOME / "conf"),
            "SPARK_DAEMON_JAVA_OPTS": class_archive.java_options(),
            "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}


def submit_args(master: str, conf: Mapping[str, str] | None = None) -> list[str]:
    """`spark-submit` and the options every pymq job takes: the master, the project's
    spark-defaults.conf, the Delta Lake / hadoop-aws jars (`jars.spark_conf()`), then `conf`; the
    driver's and the executors' JVMs map the class archive, after any Java options `conf` gives."""
    args = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", master, "--properties-file", str(SPARK_DEFAULTS)]
    settings = {**jars.spark_conf(), **(conf or {})}
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        if options := class_archive.with_archive(settings.get(key, "")):
            settings[key] = options
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    return args


class SparkDaemon(ChildProcess):
    """One Spark JVM, ready once its log (stdout and stderr, Spark's default INFO log) has a line
    matching `ready`."""

    stop_timeout_s = 20.0

    def __init__(self, what: str, args: Sequence[str], output: Path, env: Mapping[str, str]) -> None:
        self.what = what
        self.args = list(args)
        self.output = output
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: re.Pattern[str], timeout_s: float = 120.0) -> re.Match[str]:
        """Start the JVM and wait for `ready` in its log; RuntimeError with the log if it exits or
        does not get there within `timeout_s` (JVM start-ups take seconds, more on a loaded machine)."""
        self.output.parent.mkdir(parents=True, exist_ok=True)
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout_s
        while True:
            match = ready.search(self.log_tail(1 << 30))
            if match:
                return match
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.what} did not start; log {self.output}:\n{self.log_tail()}")
            time.sleep(0.1)


class StandaloneCluster:
    """A Spark standalone cluster on loopback: a Master and one Worker of `cores` cores and
    `memory` (Spark's size syntax), its executors in processes of their own, as on a real cluster."""

    def __init__(self, work: Path, cores: int = 2, memory: str = "2g") -> None:
        self.work = Path(work)
        self.cores = cores
        self.memory = memory
        self.env = spark_env()
        self.master: SparkDaemon | None = None
        self.worker: SparkDaemon | None = None
        self.master_url = ""

    def start(self) -> "StandaloneCluster":
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        # No REST submission server: it binds a fixed port (6066) that another cluster may hold.
        master_env = {**self.env, "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self.master = SparkDaemon("Spark master", [spark_class, "org.apache.spark.deploy.master.Master",
                                                   "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                                  self.work / "master.log", master_env)
        self.master_url = self.master.start(MASTER_READY).group(1)
        self.worker = SparkDaemon("Spark worker", [spark_class, "org.apache.spark.deploy.worker.Worker",
                                                   "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                                   "--cores", str(self.cores), "--memory", self.memory,
                                                   "--work-dir", str(self.work / "worker"), self.master_url],
                                  self.work / "worker.log", self.env)
        try:
            self.worker.start(WORKER_READY)
        except RuntimeError:
            self.stop()
            raise
        return self

    def submit_args(self, conf: Mapping[str, str] | None = None) -> list[str]:
        """`spark-submit` to this cluster (client mode: the driver is the submitting process)."""
        return submit_args(self.master_url, conf)

    def executor_pids(self) -> list[int]:
        """The PIDs of the executor JVMs the Worker runs now (its children)."""
        if self.worker is None or self.worker.proc is None:
            return []
        return [pid for pid in _children(self.worker.pid) if EXECUTOR_CLASS.encode() in _cmdline(pid)]

    def stop(self) -> None:
        """Stop the Worker and the Master by PID; executors the Worker left behind are SIGKILLed."""
        executors = self.executor_pids()
        stop_all([daemon for daemon in (self.worker, self.master) if daemon is not None])
        for pid in executors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ConnectServer(SparkDaemon):
    """A Spark Connect server (its own driver, `master`), with the project's Spark defaults and
    jars, and pymq importable by its Python workers. `url` is what `SparkSession.builder.remote`
    takes once started. Its log stays at Spark's default INFO level (no LOG4J in `conf`): the
    line that gives the port is an INFO line."""

    def __init__(self, work: Path, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> None:
        settings = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": "0",
                    "spark.ui.enabled": "false", **(conf or {})}
        env = spark_env()
        super().__init__("Spark Connect server", [*submit_args(master, settings), "--class", CONNECT_SERVER_CLASS],
                         Path(work) / "connect-server.log", env)
        self.url = ""

    def start_server(self, timeout_s: float = 120.0) -> "ConnectServer":
        host, port = self.start(CONNECT_READY, timeout_s).groups()
        self.url = f"sc://{host}:{port}"
        return self


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name (field 2) may hold spaces: the fields after its closing paren are fixed.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""
