"""Broker metrics in Prometheus' text format, served over HTTP when `metrics.port` is set.

Values are read from the live objects when a scrape arrives (a custom collector), so the append
and fetch paths pay nothing for them. Per partition, as Kafka's kafka.log/kafka.cluster metrics:

    pymq_log_start_offset, pymq_log_end_offset, pymq_log_high_watermark, pymq_log_size_bytes
    pymq_log_damaged_segments     segments found damaged below the recovery point at the last start
                                  (kept as they are; readers get CORRUPT_MESSAGE or a CRC mismatch)
    pymq_log_recovered_bytes      bytes the last start re-validated after the recovery point

Per broker: pymq_log_dir_offline (1 once a failed fsync took the directory offline),
pymq_log_dir_disk_full{dir} (1 while appends are refused for lack of space, broker/log/log_dir_space.py)
and pymq_log_dir_free_bytes{dir},
pymq_log_retention_failures_total, pymq_log_flushes_in_flight, pymq_connections, and
pymq_background_errors_total{task} (exceptions a background loop caught and went on after, broker/background.py).

With tiered storage (remote_logs set), per tiered partition led here, from the manifest the remote
log manager holds (none until it has read it; `pymq tier status` shows the same):

    pymq_remote_log_start_offset, pymq_remote_log_end_offset (one past the last remote offset)
    pymq_remote_log_size_bytes, pymq_remote_log_segments
    pymq_tiering_upload_lag_offsets, pymq_tiering_upload_lag_bytes
                                  local offsets / segment bytes at or above the remote end
    pymq_tiering_failures_in_a_row tiering runs failed in a row (0 once one succeeds)

and per broker the manager's counters pymq_tiering_uploaded_segments_total,
pymq_tiering_expired_segments_total (remote retention) and pymq_tiering_failures_total, and the
remote reader's (broker/remote_log/remote_log_reader.py): pymq_remote_read_cache_bytes (chunks and
indexes held), pymq_remote_read_cache_hits_total / _misses_total / _evictions_total, and
pymq_remote_reads_total / pymq_remote_read_errors_total (reads a worker ran because the cache
lacked bytes, and those that failed).

Requests (broker/request_metrics.py, Kafka's RequestMetrics): pymq_requests_total{api},
pymq_request_errors_total{api,error} and pymq_request_seconds{api,phase} (queue, local, remote,
response_send, total); per topic pymq_topic_bytes_in_total, pymq_topic_messages_in_total and
pymq_topic_bytes_out_total; pymq_log_flush_seconds (the fsyncs of a log flush); consumer groups by
state pymq_groups{state}, and for the `metrics.groups.max` groups with the most lag
pymq_group_state{group,state}, pymq_group_members and pymq_group_lag_sum, and (only with
`metrics.group.partitions.enable`) per committed partition pymq_group_committed_offset and
pymq_group_lag (high watermark less the committed offset).
docs/metrics.md lists them all with Kafka's names; conf/grafana-dashboard.json charts them.

Event loop and work queues: pymq_event_loop_lag_seconds (histogram of how late a 10 ms timer
fires, broker/loop_lag.py) and pymq_event_loop_lag_max_seconds (the worst since start);
per background pool (broker/executors.py, label `executor`) pymq_executor_queue_depth (tasks
queued or running), pymq_executor_queue_capacity, pymq_executor_rejected_tasks_total; per byte
budget (broker/backpressure.py, label `budget`: queued.max.request.bytes, the log writer queue)
pymq_backpressure_used_bytes, pymq_backpressure_peak_bytes, pymq_backpressure_limit_bytes.

The scrape runs on a thread of the endpoint's bounded pool (broker/metrics_http.py: GET /metrics
only): it reads attributes and list snapshots only, never takes a log's lock for long, and never
touches the event loop. Its size grows with the partitions hosted here and the APIs and topics
used, never with the number of groups or clients.
"""
from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from broker import background
from broker.config import BrokerConfig
from broker.histogram import Histogram
from broker.log.log_dir_space import free_bytes
from broker.metrics_http import start_metrics_server
from broker.request_metrics import PHASES

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from broker.backpressure import ByteBudget
    from broker.coordinator.group_metadata import Group
    from broker.executors import BoundedExecutor
    from broker.loop_lag import LoopLagProbe
    from broker.replica_manager import ReplicaManager
    from broker.request_metrics import RequestMetrics, TopicTraffic

log = logging.getLogger("pymq.metrics")

_PARTITION_GAUGES: list[tuple[str, str, Callable[..., int]]] = [
    ("pymq_log_start_offset", "first offset a consumer can read", lambda l: l.log_start_offset),
    ("pymq_log_end_offset", "offset the next append gets", lambda l: l.log_end_offset),
    ("pymq_log_high_watermark", "offsets below it are committed and visible to consumers", lambda l: l.high_watermark),
    ("pymq_log_size_bytes", "bytes of the partition's segments", lambda l: l.size_bytes()),
    ("pymq_log_damaged_segments", "segments found damaged below the recovery point at the last start",
     lambda l: l.damaged_segments),
    ("pymq_log_recovered_bytes", "bytes re-validated after the recovery point at the last start",
     lambda l: l.recovered_bytes),
]


_TIERING_GAUGES: list[tuple[str, str, Callable[..., int]]] = [
    ("pymq_remote_log_start_offset", "first offset the remote log holds", lambda t: t.remote_log_start_offset),
    ("pymq_remote_log_end_offset", "one past the last offset the remote log holds", lambda t: t.remote_log_end_offset),
    ("pymq_remote_log_size_bytes", "bytes of the remote segments' logs", lambda t: t.remote_bytes),
    ("pymq_remote_log_segments", "segments in the remote log", lambda t: t.remote_segments),
    ("pymq_tiering_upload_lag_offsets", "local offsets at or above the remote log end (not uploaded yet)",
     lambda t: t.upload_lag_offsets),
    ("pymq_tiering_upload_lag_bytes", "bytes of local segments at or above the remote log end (not uploaded yet)",
     lambda t: t.upload_lag_bytes),
    ("pymq_tiering_failures_in_a_row", "tiering runs of the partition failed in a row", lambda t: t.failures),
]


class BrokerCollector(Collector):
    """Reads the replica manager's partitions and the log manager's counters at scrape time."""

    def __init__(self, replicas: ReplicaManager, connections: Callable[[], int], loop_lag: LoopLagProbe | None = None,
                 executors: list[BoundedExecutor] | None = None, budgets: list[ByteBudget] | None = None,
                 requests: RequestMetrics | None = None, traffic: TopicTraffic | None = None,
                 groups: Callable[[], list[Group]] | None = None, controller: Callable[[], bool] | None = None,
                 groups_max: int = 100, group_partitions: bool = False) -> None:
        self.replicas = replicas
        self.groups_max = groups_max  # metrics.groups.max
        self.group_partitions = group_partitions  # metrics.group.partitions.enable
        self.controller = controller  # whether this broker is the controller (a cluster's brokers only)
        self.connections = connections
        self.loop_lag = loop_lag
        self.executors = executors or []
        self.budgets = budgets or []
        self.requests = requests
        self.traffic = traffic
        self.groups = groups

    def collect(self) -> Iterator[Metric]:
        families = [GaugeMetricFamily(name, doc, labels=["topic", "partition"]) for name, doc, _ in _PARTITION_GAUGES]
        leading = GaugeMetricFamily("pymq_partition_leader", "1 if this broker leads the partition, 0 if it follows",
                                    labels=["topic", "partition"])
        isr = GaugeMetricFamily("pymq_partition_in_sync_replicas", "replicas in the partition's ISR",
                                labels=["topic", "partition"])
        replica_count = GaugeMetricFamily("pymq_partition_replicas", "replicas of the partition",
                                          labels=["topic", "partition"])
        under_replicated = under_min_isr = 0
        for partition in self.replicas.hosted():
            labels = [partition.topic, str(partition.partition)]
            for family, (_, _, read) in zip(families, _PARTITION_GAUGES):
                family.add_metric(labels, read(partition.log))
            state = partition.state
            leading.add_metric(labels, int(partition.is_leader))
            isr.add_metric(labels, len(state.isr))
            replica_count.add_metric(labels, len(state.replicas))
            if partition.is_leader:
                under_replicated += len(state.isr) < len(state.replicas)
                under_min_isr += len(state.isr) < partition.log.config.min_insync_replicas
        yield from families
        yield from (leading, isr, replica_count)
        yield GaugeMetricFamily("pymq_under_replicated_partitions", "partitions led here whose ISR lacks a replica",
                                value=under_replicated)
        yield GaugeMetricFamily("pymq_under_min_isr_partitions", "partitions led here with fewer in-sync replicas "
                                "than min.insync.replicas (acks=all produces to them fail)", value=under_min_isr)
        yield CounterMetricFamily("pymq_isr_shrinks", "ISR changes this broker stored that removed replicas",
                                  value=self.replicas.isr_shrinks)
        yield CounterMetricFamily("pymq_isr_expands", "ISR changes this broker stored that added replicas",
                                  value=self.replicas.isr_expands)
        if self.controller is not None:
            yield GaugeMetricFamily("pymq_active_controller", "1 while this broker is the cluster's controller",
                                    value=int(self.controller()))
        logs = self.replicas.logs
        yield GaugeMetricFamily("pymq_log_dir_offline", "1 once a failed fsync took the log directory offline",
                                value=int(logs.failure.failed))
        directory = [str(logs.log_dir)]
        full = GaugeMetricFamily("pymq_log_dir_disk_full", "1 while appends are refused for lack of space "
                                 "(since the last append failed with ENOSPC or EDQUOT)", labels=["dir"])
        full.add_metric(directory, int(logs.failure.space.full))
        free = GaugeMetricFamily("pymq_log_dir_free_bytes", "bytes free for the broker on the log directory's "
                                 "filesystem", labels=["dir"])
        free.add_metric(directory, free_bytes(logs.log_dir))
        yield from (full, free)
        yield CounterMetricFamily("pymq_log_retention_failures", "partitions whose retention run failed",
                                  value=logs.retention_failures)
        yield GaugeMetricFamily("pymq_log_flushes_in_flight", "log flushes running now",
                                value=self.replicas.flushes_in_flight)
        yield GaugeMetricFamily("pymq_connections", "client connections open", value=self.connections())
        errors = CounterMetricFamily("pymq_background_errors", "exceptions a background task caught and went on after",
                                     labels=["task"])
        for task, count in sorted(background.error_counts().items()):
            errors.add_metric([task], count)
        yield errors
        yield _histogram("pymq_log_flush_seconds", "how long a log flush (the fsyncs of a partition's unflushed "
                         "segments) took", [], {(): logs.failure.sync_seconds})
        yield from self._loop_and_queues()
        yield from self._requests()
        yield from self._groups()
        if self.replicas.remote_logs is not None:
            yield from self._tiering()

    def _requests(self) -> Iterator[Metric]:
        if self.requests is not None:
            by_api = self.requests.named()  # a snapshot: the loop may add an API meanwhile
            requests = CounterMetricFamily("pymq_requests", "requests answered (or, with acks=0, handled)",
                                           labels=["api"])
            errors = CounterMetricFamily("pymq_request_errors", "responses carrying an error code, by its name",
                                         labels=["api", "error"])
            for api, metrics in sorted(by_api.items()):
                requests.add_metric([api], metrics.requests)
                for error, count in sorted(dict(metrics.errors).items()):
                    errors.add_metric([api, error], count)
            yield from (requests, errors)
            yield _histogram("pymq_request_seconds", "time of a request by phase: queue (read, not started), local "
                             "(the handler, with what it awaits), remote (parked in a purgatory), response_send, "
                             "total", ["api", "phase"],
                             {(api, phase): h for api, m in by_api.items() for phase, h in zip(PHASES, m.phases)})
        if self.traffic is not None:
            for name, doc, counts in [("bytes_in", "record batch bytes appended by produces", self.traffic.bytes_in),
                                      ("messages_in", "records appended by produces", self.traffic.messages_in),
                                      ("bytes_out", "record batch bytes sent in fetch responses", self.traffic.bytes_out)]:
                family = CounterMetricFamily(f"pymq_topic_{name}", doc, labels=["topic"])
                for topic, count in sorted(dict(counts).items()):
                    family.add_metric([topic], count)
                yield family

    def _groups(self) -> Iterator[Metric]:
        """Groups by state (always), and for the `groups_max` groups with the most lag their state,
        members and total lag (the high watermark less the committed offset, summed over the
        partitions hosted here), as kafka-consumer-groups.sh shows them; with `group_partitions`
        also each of their partitions' committed offset and lag. Bounded: a broker with 20,000
        groups scraped 42 MB when every group and partition had series."""
        if self.groups is None:
            return
        groups = self.groups()
        by_state = GaugeMetricFamily("pymq_groups", "consumer groups coordinated here, by state", labels=["state"])
        for name, count in sorted(Counter(group.state.value for group in groups).items()):
            by_state.add_metric([name], count)
        yield by_state
        state = GaugeMetricFamily("pymq_group_state", "1 for the group's current state", labels=["group", "state"])
        members = GaugeMetricFamily("pymq_group_members", "members of the group", labels=["group"])
        total = GaugeMetricFamily("pymq_group_lag_sum", "the group's lag summed over its committed partitions",
                                  labels=["group"])
        committed = GaugeMetricFamily("pymq_group_committed_offset", "the group's committed offset",
                                      labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily("pymq_group_lag", "high watermark less the committed offset",
                                labels=["group", "topic", "partition"])
        hosted = {(p.topic, p.partition): p.log for p in self.replicas.hosted()}
        lags = [(group, _lags(group, hosted)) for group in groups]
        for group, partition_lags in heapq.nlargest(self.groups_max, lags, key=lambda entry: sum(entry[1].values())):
            state.add_metric([group.group_id, group.state.value], 1)
            members.add_metric([group.group_id], len(group.members))
            total.add_metric([group.group_id], sum(partition_lags.values()))
            if not self.group_partitions:
                continue
            for (topic, partition), offset in sorted(dict(group.offsets).items()):
                labels = [group.group_id, topic, str(partition)]
                committed.add_metric(labels, offset.offset)
                if (topic, partition) in partition_lags:
                    lag.add_metric(labels, partition_lags[(topic, partition)])
        yield from (state, members, total)
        if self.group_partitions:
            yield from (committed, lag)

    def _loop_and_queues(self) -> Iterator[Metric]:
        if self.loop_lag is not None:
            yield _histogram("pymq_event_loop_lag_seconds", "how late a 10 ms timer on the event loop fired", [],
                             {(): self.loop_lag.lags})
            yield GaugeMetricFamily("pymq_event_loop_lag_max_seconds", "worst event loop lag since start",
                                    value=self.loop_lag.max_s)
        depth = GaugeMetricFamily("pymq_executor_queue_depth", "background tasks queued or running", labels=["executor"])
        capacity = GaugeMetricFamily("pymq_executor_queue_capacity", "background tasks the pool holds before callers "
                                     "wait (or are refused)", labels=["executor"])
        rejected = CounterMetricFamily("pymq_executor_rejected_tasks", "tasks refused because the pool was full",
                                       labels=["executor"])
        for executor in self.executors:
            depth.add_metric([executor.name], executor.depth)
            capacity.add_metric([executor.name], executor.capacity)
            rejected.add_metric([executor.name], executor.rejected)
        yield from (depth, capacity, rejected)
        families = [GaugeMetricFamily(f"pymq_backpressure_{name}_bytes", doc, labels=["budget"]) for name, doc in
                    [("used", "bytes held now"), ("peak", "most bytes held at once since start"),
                     ("limit", "bytes past which the connections feeding the budget stop being read")]]
        for budget in self.budgets:
            for family, value in zip(families, (budget.used_bytes, budget.peak_bytes, budget.limit_bytes)):
                family.add_metric([budget.name], value)
        yield from families

    def _tiering(self) -> Iterator[Metric]:
        from broker.remote_log.tiering_status import describe_partition
        from common.errors import PymqError

        remote_logs = self.replicas.remote_logs
        assert remote_logs is not None
        families = [GaugeMetricFamily(name, doc, labels=["topic", "partition"]) for name, doc, _ in _TIERING_GAUGES]
        for partition_log in self.replicas.leader_logs():
            if not partition_log.tiered:
                continue
            try:
                tiering = describe_partition(partition_log, remote_logs)
            except PymqError:
                continue  # closed meanwhile (deleted, directory offline)
            labels = [partition_log.topic, str(partition_log.partition)]
            for family, (name, _, read) in zip(families, _TIERING_GAUGES):
                # Before the manifest is read nothing is known of the remote log, only the failures.
                if tiering.manifest_version >= 0 or name == "pymq_tiering_failures_in_a_row":
                    family.add_metric(labels, read(tiering))
        yield from families
        yield CounterMetricFamily("pymq_tiering_uploaded_segments", "segments uploaded to the remote store",
                                  value=remote_logs.uploaded_segments)
        yield CounterMetricFamily("pymq_tiering_expired_segments", "remote segments removed by retention",
                                  value=remote_logs.expired_segments)
        yield CounterMetricFamily("pymq_tiering_failures", "tiering runs that failed", value=remote_logs.failures)
        reader = remote_logs.reader
        yield GaugeMetricFamily("pymq_remote_read_cache_bytes", "bytes of remote chunks and indexes cached",
                                value=reader.cache.size_bytes)
        for name, doc, value in [("hits", "cache lookups that found the entry", reader.cache.hits),
                                 ("misses", "cache lookups that did not", reader.cache.misses),
                                 ("evictions", "entries evicted to stay within the cache size", reader.cache.evictions)]:
            yield CounterMetricFamily(f"pymq_remote_read_cache_{name}", doc, value=value)
        yield CounterMetricFamily("pymq_remote_reads", "remote reads run by a worker (the cache lacked bytes)",
                                  value=reader.worker_reads)
        yield CounterMetricFamily("pymq_remote_read_errors", "remote reads that failed", value=reader.read_errors)


def _lags(group: Group, hosted: dict[tuple[str, int], Any]) -> dict[tuple[str, int], int]:
    """The lag of each of the group's committed partitions hosted here."""
    lags = {}
    for tp, offset in list(group.offsets.items()):
        partition_log = hosted.get(tp)
        if partition_log is not None:
            lags[tp] = max(0, partition_log.high_watermark - offset.offset)
    return lags


def _histogram(name: str, doc: str, labels: list[str], histograms: dict[tuple[str, ...], Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, histogram in sorted(histograms.items()):
        family.add_metric(list(values), histogram.cumulative(), histogram.sum)
    return family


def serve_metrics(host: str, port: int, replicas: ReplicaManager, connections: Callable[[], int],
                  config: BrokerConfig | None = None, **runtime: Any) -> WSGIServer:
    """Start the /metrics endpoint (broker/metrics_http.py: one path, a bounded thread pool);
    returns the server (its port, to stop it). `config`: the broker's (metrics.groups.max,
    metrics.group.partitions.enable; their defaults without it). `runtime`: BrokerCollector's
    optional event-loop and queue sources."""
    config = config or BrokerConfig()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(replicas, connections, groups_max=config["metrics.groups.max"],
                                      group_partitions=config["metrics.group.partitions.enable"], **runtime))
    server = start_metrics_server(host, port, registry)
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)
    return server
