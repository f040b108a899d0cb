"""Spark registers `format("pymq")` itself from the installed `pyspark_pymq` package (SPARK-45917):
sessions nobody called `register()` on, Python threads with no active session and Spark SQL's
`CREATE TEMPORARY VIEW ... USING pymq` all find it; `register()` stays harmless where it is also called.

The shared `spark` fixture (`local_spark`) no longer calls `register()` either, so every Spark test
of the suite runs on the static registration.
"""
from __future__ import annotations

import os
import pkgutil
import site
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource

from client import Admin, Producer
from spark_datasource import PymqDataSource, register

THREAD_JOIN_S = 240


def read_text(session: SparkSession, bootstrap: str, topic: str) -> list[tuple[str, str]]:
    rows = (session.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .load().selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect())
    return sorted((row[0], row[1]) for row in rows)


def in_new_thread(work) -> Any:  # type: ignore[no-untyped-def]
    """Run `work()` in a new Python thread; return its result or raise its error here."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as err:  # noqa: BLE001 - re-raised in the calling thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="no-active-session")
    thread.start()
    thread.join(THREAD_JOIN_S)
    assert not thread.is_alive(), f"the thread did not finish in {THREAD_JOIN_S} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_default_source_is_what_spark_lookup_finds():
    """The package Spark's lookup imports is a top-level `pyspark_*` module whose DefaultSource is the pymq source."""
    import pyspark_pymq

    assert "pyspark_pymq" in {info.name for info in pkgutil.iter_modules()}
    assert pyspark_pymq.DefaultSource is PymqDataSource
    assert issubclass(pyspark_pymq.DefaultSource, DataSource) and pyspark_pymq.DefaultSource.name() == "pymq"


def test_static_import_is_on_unless_switched_off():
    """local_spark registers by hand only when a caller switches Spark's static registration off."""
    from spark_datasource.session import static_import_enabled

    key = "spark.sql.pyspark.dataSource.staticImport.enabled"
    assert static_import_enabled({})
    assert static_import_enabled({key: "true"})
    assert not static_import_enabled({key: "false"})
    assert not static_import_enabled({key: " FALSE "})


def test_local_spark_hands_the_source_tree_to_spark_workers(monkeypatch):
    """An editable install is invisible to Spark's lookup: local_spark puts the tree holding pyspark_pymq on PYTHONPATH."""
    from spark_datasource.session import _expose_to_static_lookup

    root = Path(__import__("pyspark_pymq").__file__).resolve().parent.parent
    if str(root) in {str(Path(path).resolve()) for path in site.getsitepackages()}:
        pytest.skip("pymq is installed in site-packages, where Spark's lookup finds it")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert _expose_to_static_lookup()
    assert os.environ["PYTHONPATH"].split(os.pathsep) == ["/elsewhere", str(root)]
    assert _expose_to_static_lookup() and os.environ["PYTHONPATH"].split(os.pathsep) == ["/elsewhere", str(root)]
    assert "pyspark_pymq" in {info.name for info in pkgutil.iter_modules([str(root)])}


def test_write_and_read_from_a_new_thread_in_an_unregistered_session(spark, source_broker, topic_name):
    """A new thread with no active session writes and reads through a session nobody registered the source on."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    expected = sorted((f"k{i % 3}", f"v{i}") for i in range(30))

    def work() -> list[tuple[str, str]]:
        active = SparkSession.getActiveSession()
        assert active is None, f"the new thread has an active session: {active}"
        session = spark.newSession()  # what a notebook kernel, Spark Connect or a job someone else started gets
        (session.createDataFrame(expected, "key string, value string").write.format("pymq").mode("append")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).save())
        return read_text(session, bootstrap, topic_name)

    assert in_new_thread(work) == expected


def test_shared_session_used_from_a_new_thread(spark, source_broker, topic_name):
    """The shared session, used from a thread where it is not the active session, writes and reads."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    expected = [(f"k{i}", f"v{i}") for i in range(10)]

    def work() -> list[tuple[str, str]]:
        (spark.createDataFrame(expected, "key string, value string").write.format("pymq").mode("append")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).save())
        return read_text(spark, bootstrap, topic_name)

    assert in_new_thread(work) == sorted(expected)


def test_sql_view_using_pymq_selects_the_topic(spark, source_broker, topic_name):
    """Spark SQL in a fresh session: CREATE TEMPORARY VIEW ... USING pymq OPTIONS (...), then SELECT returns what was produced."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    produced = [(f"user-{i % 4}", f"event-{i}") for i in range(24)]
    with Producer(bootstrap, linger_ms=0) as producer:
        for key, value in produced:
            producer.send(topic_name, value.encode(), key=key.encode())
        producer.flush()
    view = "pymq_" + "".join(char if char.isalnum() else "_" for char in topic_name)
    sql = spark.newSession()
    sql.sql(f"CREATE TEMPORARY VIEW {view} USING pymq "
            f"OPTIONS ('kafka.bootstrap.servers' '{bootstrap}', subscribe '{topic_name}')")
    rows = sql.sql(f"SELECT CAST(key AS STRING) AS key, CAST(value AS STRING) AS value, partition, offset "
                   f"FROM {view}").collect()
    counts = sql.sql(f"SELECT partition, count(*) AS n FROM {view} GROUP BY partition").collect()
    assert sorted((row.key, row.value) for row in rows) == sorted(produced)
    assert sum(row.n for row in counts) == len(produced)
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row.offset)
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in by_partition.values())


def test_register_is_idempotent_beside_the_static_registration(spark, source_broker, topic_name):
    """register() called twice, on a session and on one made from it, beside the static source, changes nothing: reads still work."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(bootstrap, linger_ms=0) as producer:
        producer.send(topic_name, b"v", key=b"k")
        producer.flush()
    parent = spark.newSession()  # not the shared session: the rest of the suite reads through the static registration
    register(parent)
    register(parent)
    child = parent.newSession()  # inherits parent's registration: Spark refuses a second one of that name
    register(child)
    register(child)
    assert read_text(parent, bootstrap, topic_name) == [("k", "v")]
    assert read_text(child, bootstrap, topic_name) == [("k", "v")]


class _RefusingDataSources:
    """A session's `dataSource` that refuses every registration with `condition` (what Spark 4.2 did
    in a `newSession()` of a session that had registered pymq, static registration not finding it)."""

    def __init__(self, condition: str) -> None:
        self.condition = condition

    def register(self, source: type) -> None:
        raise AnalysisException(message=f"[{self.condition}] refused", errorClass=self.condition, messageParameters={})


@pytest.mark.parametrize("condition, kept", [("DATA_SOURCE_ALREADY_EXISTS", True), ("SOMETHING_ELSE", False)],
                         ids=["already-registered", "other-error"])
def test_register_keeps_an_existing_registration_and_raises_the_rest(condition, kept):
    """register() treats DATA_SOURCE_ALREADY_EXISTS as done (the same source) and raises any other refusal."""
    session = SimpleNamespace(dataSource=_RefusingDataSources(condition))
    if kept:
        register(session)  # type: ignore[arg-type]
    else:
        with pytest.raises(AnalysisException, match="SOMETHING_ELSE"):
            register(session)  # type: ignore[arg-type]
