"""A rolling restart of all three brokers under load: a producer (acks=all, retries on) and a
consumer group keep working with no user code involved, and nothing acknowledged is lost.

Retries are on, as users run them: a batch whose acknowledgement was lost with its leader may be
stored twice (until producers are idempotent), so the checker allows duplicates here and demands
the rest: nothing lost, no offset holding two records, no gap, order kept per reader."""
from __future__ import annotations

import threading
import time

from client import Admin, Consumer
from tests.e2e.checker import History
from tests.helpers.cluster_scenarios import Load, read_all, wait_for, wait_for_full_isr

TOPIC = "rolling"
PARTITIONS = 3


class GroupReader(threading.Thread):
    """A group member consuming the topic (commits automatically) until stopped."""

    def __init__(self, bootstrap: str, history: History) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.history = bootstrap, history
        self.stopping = threading.Event()
        self.values: set[bytes] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Consumer(self.bootstrap, group_id="rolling-readers", auto_offset_reset="earliest",
                          request_timeout_ms=5_000, session_timeout_ms=10_000) as consumer:
                consumer.subscribe([TOPIC])
                while not self.stopping.is_set():
                    table = consumer.poll_arrow(timeout_ms=200)
                    self.values.update(table["value"].to_pylist())
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


def test_a_rolling_restart_under_load_loses_nothing_acknowledged(cluster):
    local = cluster(3)
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": 2})
        wait_for_full_isr(admin, TOPIC)
    load, reader = Load(local.bootstrap, history, TOPIC), GroupReader(local.bootstrap, history)
    load.start()
    reader.start()
    load.wait_acked(2000)
    with Admin(local.bootstrap) as admin:
        for broker in local.brokers:
            broker.stop()
            time.sleep(1)  # not a condition, the point: the load runs on while the broker is down
            broker.start()
            wait_for_full_isr(admin, TOPIC, timeout_s=60)
            load.wait_acked(1000)
    load.finish()
    assert not history.failed, f"{len(history.failed)} sends failed, e.g. {list(history.failed.items())[:3]}"
    read_all(local.bootstrap, TOPIC, PARTITIONS, history, "final")
    report = history.check(allow_duplicates=True)
    print(f"rolling restart: {report}; {load.sent} sent")
    assert report.ok, str(report)
    assert report.acknowledged == load.sent > 1000
    try:
        wait_for(lambda: set(history.acked) <= reader.values, 60, "the group to read every acknowledged record")
    except AssertionError:
        missing = set(history.acked) - reader.values
        by_partition = {}
        for value in missing:
            p, o = history.acked[value]
            by_partition.setdefault(p, []).append(o)
        raise AssertionError(f"the group misses {len(missing)} of {len(history.acked)}: "
                             f"{ {p: (min(o), max(o), len(o)) for p, o in by_partition.items()} }; "
                             f"reader error {reader.error!r}, alive {reader.is_alive()}") from None
    reader.stopping.set()
    reader.join(30)
    assert reader.error is None, reader.error
