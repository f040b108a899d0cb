"""Request, traffic, flush and consumer-group metrics read from a real broker's /metrics after
real traffic, checked against what the traffic was: counts exact, latencies plausible.

One broker with `metrics.port` 0 and a flush on every message (so every acknowledged produce
runs a log flush the broker times)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from client import Admin, Consumer, Producer
from broker.process import BrokerProcess

TOPIC = "metered"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    process = BrokerProcess(tmp_path_factory.mktemp("metrics") / "broker",
                            {"metrics.port": 0, "log.flush.interval.messages": 1}).start()
    yield process
    process.kill()


def value(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sample `name{labels}` (labels in Prometheus' sorted order), 0 when absent."""
    key = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    return metrics.get(key, 0.0)


@pytest.mark.slow
def test_requests_traffic_and_flushes_are_counted_as_they_happened(broker: BrokerProcess) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=2)
    before = broker.metrics()
    batch = pa.table({"value": [b"x" * 100] * 50})
    with Producer(broker.bootstrap, linger_ms=0, acks=1) as producer:
        for p in (0, 1):  # two produce requests of one batch each, flushed before the next
            producer.send_batch(TOPIC, batch, partition=p)
            producer.flush()
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(TOPIC, 0), (TOPIC, 1)])
        assert len(list(consumer.records(idle_timeout_ms=500))) == 100
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(Exception):
            admin.describe_topics(["no-such-topic"])
    after = broker.metrics()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("pymq_requests_total", api="produce") == 2
    assert delta("pymq_topic_messages_in_total", topic=TOPIC) == 100
    assert delta("pymq_topic_bytes_in_total", topic=TOPIC) > 100 * 100  # values plus batch framing
    assert delta("pymq_topic_bytes_out_total", topic=TOPIC) == delta("pymq_topic_bytes_in_total", topic=TOPIC)
    assert delta("pymq_request_errors_total", api="metadata", error="UNKNOWN_TOPIC_OR_PARTITION") >= 1
    # Every request is in each phase's histogram once, and a phase never exceeds the total.
    for phase in ("queue", "local", "remote", "response_send", "total"):
        assert delta("pymq_request_seconds_count", api="produce", phase=phase) == 2
    total = delta("pymq_request_seconds_sum", api="produce", phase="total")
    assert 0 < total < 10 and all(delta("pymq_request_seconds_sum", api="produce", phase=p) <= total + 1e-9
                                  for p in ("queue", "local", "remote", "response_send"))
    # Fetches that waited for data were parked: their remote time shows.
    fetches = delta("pymq_request_seconds_count", api="fetch", phase="total")
    assert fetches >= 1 and delta("pymq_request_seconds_sum", api="fetch", phase="remote") > 0
    # flush.messages=1: each produce's append was flushed, and the flush timed.
    assert delta("pymq_log_flush_seconds_count") >= 2 and 0 < delta("pymq_log_flush_seconds_sum") < 10
    assert value(after, "pymq_request_seconds_bucket", api="produce", phase="total", le="+Inf") == value(
        after, "pymq_request_seconds_count", api="produce", phase="total")


@pytest.mark.slow
def test_a_groups_state_members_and_lag_per_partition(broker_factory) -> None:
    """A member that consumed 30 of 50 records and committed: Stable, one member, lag 20; once it
    left: Empty, no members, the lag still there (per partition with metrics.group.partitions.enable)."""
    broker = broker_factory(**{"metrics.group.partitions.enable": "true"}).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("lagging", partitions=1)
    with Producer(broker.bootstrap) as producer:
        producer.send_batch("lagging", pa.table({"value": [b"v"] * 50}))
        producer.flush()
    with Consumer(broker.bootstrap, group_id="dashboards", auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.subscribe(["lagging"])
        while not consumer.assignment():
            consumer.poll(200)
        consumer.commit({("lagging", 0): 30})
        metrics = broker.metrics()
        assert value(metrics, "pymq_group_state", group="dashboards", state="Stable") == 1
        assert value(metrics, "pymq_group_members", group="dashboards") == 1
        labels = {"group": "dashboards", "topic": "lagging", "partition": "0"}
        assert value(metrics, "pymq_group_committed_offset", **labels) == 30
        assert value(metrics, "pymq_group_lag", **labels) == 20
        assert value(metrics, "pymq_group_lag_sum", group="dashboards") == 20
        assert value(metrics, "pymq_groups", state="Stable") == 1
    metrics = broker.metrics()
    assert value(metrics, "pymq_group_state", group="dashboards", state="Empty") == 1
    assert value(metrics, "pymq_group_members", group="dashboards") == 0
    assert value(metrics, "pymq_group_lag", **labels) == 20


def test_the_dashboard_and_the_metrics_page_match_what_the_broker_serves(broker: BrokerProcess) -> None:
    """Every metric conf/grafana-dashboard.json queries is served, and every metric a broker with
    a group and traffic serves is listed in docs/metrics.md (tiering's need a tiering broker: the
    page lists them, checked by name only)."""
    import json
    import re
    from pathlib import Path

    with Admin(broker.bootstrap) as admin:  # traffic of every kind, so that every family has samples
        admin.create_topic("served", partitions=1)
        admin.alter_group_offsets("served-group", {("served", 0): 0})
        with pytest.raises(Exception):
            admin.find_coordinator("")
    with Producer(broker.bootstrap) as producer:
        producer.send("served", b"v")
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("served", 0)])
        assert len(list(consumer.records(idle_timeout_ms=300))) == 1
    root = Path(__file__).resolve().parents[2]
    served = {re.sub(r"_(bucket|sum|count)$", "", name.split("{")[0]) for name in broker.metrics()}
    dashboard = json.loads((root / "conf" / "grafana-dashboard.json").read_text())
    queried = {re.sub(r"_(bucket|sum|count)$", "", name) for panel in dashboard["panels"]
               for target in panel["targets"] for name in re.findall(r"pymq_[a-z_]+", target["expr"])}
    tiering = {name for name in queried if name.startswith(("pymq_tiering", "pymq_remote"))}
    assert queried - tiering <= served, queried - tiering - served
    page = (root / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(pymq_[a-z_]+)`", page))
    assert served <= documented, served - documented
    assert tiering <= documented
