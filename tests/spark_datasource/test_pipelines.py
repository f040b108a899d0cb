"""The example Spark Declarative Pipeline (jobs/pipelines/) run by pyspark's own `spark-pipelines`
against a real broker: its streaming table holds every produced event exactly once, and its
materialized views count exactly what was produced, per page and per key.

One run of the CLI costs two JVMs (spark-submit's driver running the CLI, and the Spark Connect
server the CLI starts), so the module does one run and checks everything on its output. The run
is the repository's spec, definition files and Spark settings (its SPARK_CONF_DIR), with the
storage, warehouse, catalog, broker and topic this test's. The run's processes are in a session
of their own, found by session id and killed by PID if any outlives the run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from client import Admin, Producer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "jobs" / "pipelines"
SPARK_PIPELINES = Path(sys.executable).parent / "spark-pipelines"
PARTITIONS = 3
PAGES = ["/home", "/search", "/cart", "/checkout"]
USERS = 7
BATCHES, PER_BATCH = 3, 200
RUN_TIMEOUT_S = 420  # a run took 2 min on 2 cores under a load average of 14
KEPT_UNDER = "/tmp/pymq-pipelines"  # where the pipeline's settings keep its tables, catalog and checkpoints


def events(batch: int) -> pa.Table:
    """Demo-shaped page views (jobs/demo.py): key `user-N`, JSON value with the page; pages and
    users each with their own count, so a miscounted or swapped group shows."""
    n = range(batch * PER_BATCH, (batch + 1) * PER_BATCH)
    return pa.table({"key": [f"user-{i % USERS}" for i in n],
                     "value": [json.dumps({"page": PAGES[min(i % 5, 3)], "user": f"user-{i % USERS}"}) for i in n]})


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (field 6 of /proc/PID/stat), however deep: the JVMs, the CLI,
    Python workers and their daemon (which leaves the process group but not the session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[3]) == sid:
                found.append(int(entry.name))
    return found


def kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def committed_rows(table: Path) -> pa.Table:
    """A streaming table's rows as Spark reads them: the files its sink's log (`_spark_metadata`)
    committed, not whatever else the folder holds."""
    files: set[str] = set()
    batches = {int(p.name.removesuffix(".compact")): p for p in (table / "_spark_metadata").iterdir()
               if p.name.removesuffix(".compact").isdigit()}
    for batch in sorted(batches):
        for line in batches[batch].read_text().splitlines()[1:]:  # after the version line
            record = json.loads(line)
            path = unquote(urlparse(record["path"]).path)
            if record["action"] == "add":
                files.add(path)
            else:
                files.discard(path)
    assert files, f"{table} committed no file"
    return pa.concat_tables(pq.read_table(path) for path in sorted(files))


def spec_for(tmp_path: Path, bootstrap: str, topic: str) -> Path:
    """The repository's pipeline with this test's storage, broker and topic."""
    project = tmp_path / "project"
    shutil.copytree(PIPELINE / "transformations", project / "transformations",
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((PIPELINE / "spark-pipeline.yml").read_text())
    assert spec["storage"].startswith(f"file://{KEPT_UNDER}/")
    spec["storage"] = spec["storage"].replace(KEPT_UNDER, str(tmp_path))
    spec["configuration"].update({"spark.pymq.bootstrap.servers": bootstrap, "spark.pymq.topic": topic})
    (project / "spark-pipeline.yml").write_text(yaml.safe_dump(spec))
    return project / "spark-pipeline.yml"


def conf_dir_for(tmp_path: Path) -> Path:
    """The pipeline's Spark settings with everything it keeps in `tmp_path`."""
    conf = tmp_path / "conf"
    conf.mkdir()
    defaults = (PIPELINE / "conf" / "spark-defaults.conf").read_text()
    (conf / "spark-defaults.conf").write_text(defaults.replace(KEPT_UNDER, str(tmp_path)))
    return conf


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_pipeline_tables_hold_what_the_topic_holds(source_broker, tmp_path: Path) -> None:
    topic = "pipelines.page-views"
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS)
    produced = pa.concat_tables(events(b) for b in range(BATCHES))
    with Producer(bootstrap) as producer:
        for batch in range(BATCHES):
            producer.send_batch(topic, events(batch))
        producer.flush()
    with Admin(bootstrap) as admin:
        ends = admin.list_offsets({(topic, p): -1 for p in range(PARTITIONS)})
    log_end = {tp[1]: offset for tp, (offset, _) in ends.items()}
    assert sum(log_end.values()) == produced.num_rows

    warehouse = tmp_path / "warehouse"
    env = {**os.environ,
           "SPARK_CONF_DIR": str(conf_dir_for(tmp_path)),
           "PYSPARK_PYTHON": sys.executable,  # the script's default is python3, which may lack pymq
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "SPARK_LOCAL_IP": "127.0.0.1",
           # The local Connect server binds an ephemeral port and the CLI asks it which (pyspark's
           # own tests do this), instead of 15002 for every run on the machine.
           "SPARK_TESTING": "1"}
    command = [str(SPARK_PIPELINES), "run", "--spec", str(spec_for(tmp_path, bootstrap, topic)), "--remote", "local[2]"]
    output = tmp_path / "spark-pipelines.out"
    with output.open("wb") as out:
        run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        try:
            code = run.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        log = output.read_text(errors="replace")
        assert code == 0, f"spark-pipelines exited {code}:\n{log[-6000:]}"
        assert "Run is COMPLETED" in log, log[-6000:]
    finally:
        if run.poll() is None:
            kill_session(run.pid)
            run.wait(30)
        # The Connect server's JVM and the Python workers end once the CLI has: give them time, then
        # SIGKILL what is left of the session.
        try:
            wait_until(lambda: not session_pids(run.pid), 60, "the pipeline's processes to exit", interval_s=0.5)
        except AssertionError:
            kill_session(run.pid)

    rows = committed_rows(warehouse / "page_views")
    assert rows.num_rows == produced.num_rows
    assert Counter(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist())) == \
        Counter((p, o) for p in range(PARTITIONS) for o in range(log_end[p])), "each record of the topic once"
    users = produced["key"].to_pylist()
    pages = [json.loads(value)["page"] for value in produced["value"].to_pylist()]
    assert Counter(zip(rows["user"].to_pylist(), rows["page"].to_pylist())) == Counter(zip(users, pages))

    per_page = pq.read_table(warehouse / "views_per_page").to_pylist()
    assert sorted((r["page"], r["views"]) for r in per_page) == sorted(Counter(pages).items())
    per_user = pq.read_table(warehouse / "views_per_user").to_pylist()
    assert sorted((r["user"], r["views"]) for r in per_user) == sorted(Counter(users).items())
