"""Driver side of a read: which partitions it covers and where each starts and ends (Kafka's
KafkaOffsetReader).

Every question goes to the brokers through one `Admin`: the topic list (for subscribePattern),
each topic's partitions, and ListOffsets for earliest, latest and by-time positions. The answers
become plain `{topic: {partition: offset}}` maps, the same shape a streaming query checkpoints.

Topics are deleted, re-created and change leaders while a query runs, also between two of these
questions (a topic listed, then gone when its offsets are asked). Such a metadata race
(`METADATA_RACES`) costs the topic it hit that one answer, never the whole lookup: a question
that fails with one is asked again about each of its topics alone, and the partitions of a topic
that fails again are left out of the answer. The caller decides what a missing answer means
(a stream: no new data this trigger; planning: data loss per failOnDataLoss), so no retry
count decides the outcome.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from client import EARLIEST, LATEST, Admin
from client.admin import AdminError
from common.errors import BrokerNotAvailableError, NotLeaderError, UnknownTopicOrPartitionError
from common.topic_partition import TopicPartition
from spark_datasource.options import STRATEGY_ERROR, InvalidOptionError, OffsetSpec, SourceOptions

PartitionOffsets = dict[TopicPartition, int]
A = TypeVar("A")

log = logging.getLogger("pymq.spark.offsets")

# What a lookup meets while a topic is deleted or re-created (UNKNOWN_TOPIC_OR_PARTITION, also
# for a partition number the new incarnation lacks) or its leader moves (NOT_LEADER; a partition
# without a leader, LEADER_NOT_AVAILABLE in Kafka, is a leader this client cannot reach).
METADATA_RACES = (UnknownTopicOrPartitionError, NotLeaderError, BrokerNotAvailableError)


class OffsetReader:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Admin | None = None
        # The id of each topic `topic_partitions` described: which incarnation of a topic name
        # the brokers serve (remote manifests of another one must not be read as this one).
        self.topic_ids: dict[str, str] = {}

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.options.bootstrap_servers, **_admin_settings(self.options))
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def topic_partitions(self, missing_ok: bool) -> list[TopicPartition]:
        """The partitions the subscription covers now. A named topic (or partition) that does not
        exist is an error unless `missing_ok` (a streaming query waits for it to appear); a topic
        deleted between the listing and its description is one that does not exist."""
        opts = self.options
        existing = set(self.admin.list_topics())
        if opts.subscribe_pattern is not None:
            named = []
            wanted = sorted(t for t in existing if opts.topic_matches(t) and not t.startswith("__"))
        else:
            named = list(dict.fromkeys(opts.subscribe)) if opts.subscribe else sorted(opts.assign or {})
            wanted = [t for t in named if t in existing]
        described = self._per_topic(lambda topics: {d.name: d for d in self.admin.describe_topics(topics)}, wanted)
        missing = [t for t in named if t not in described]
        if missing and not missing_ok:
            raise InvalidOptionError(f"unknown topic(s) {', '.join(missing)} in option "
                                     f"{'subscribe' if opts.subscribe else 'assign'}")
        wanted = [t for t in wanted if t in described]
        self.topic_ids.update((name, d.topic_id) for name, d in described.items())
        counts = {name: len(d.partitions) for name, d in described.items()}
        if opts.assign is not None:
            out = []
            for topic in wanted:
                absent = [p for p in opts.assign[topic] if p >= counts[topic]]
                if absent and not missing_ok:
                    raise InvalidOptionError(f"option 'assign': topic {topic!r} has {counts[topic]} partition(s), "
                                             f"no partition {absent[0]}")
                out.extend((topic, p) for p in opts.assign[topic] if p < counts[topic])
            return out
        return [(topic, p) for topic in wanted for p in range(counts[topic])]

    # Every lookup below leaves out the partitions that got no answer (a metadata race).

    def earliest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(tps, EARLIEST))

    def latest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(tps, LATEST))

    def resolve(self, spec: OffsetSpec, tps: list[TopicPartition], starting: bool) -> PartitionOffsets:
        """Concrete offsets for `tps`, the subscription's partitions, from a starting or ending
        spec. A JSON spec must name every partition of the subscription (Kafka's rule): a
        partition left out has no defined place."""
        if not tps:
            return {}
        if spec.kind == "earliest":
            return self.earliest(tps)
        if spec.kind == "latest":
            return self.latest(tps)
        if spec.kind == "timestamp":
            times = dict.fromkeys(tps, spec.timestamp)
        else:
            named = {(t, p): v for t, ps in spec.offsets.items() for p, v in ps.items()}
            everything = set(tps)
            unknown = sorted(set(named) - everything)
            missing = sorted(everything - set(named))
            if unknown or missing:
                problem = (f"names {', '.join(f'{t}-{p}' for t, p in unknown)}, which the subscription does not "
                           "have (no such topic or partition, or a topic it does not subscribe to)"
                           if unknown else f"leaves out {', '.join(f'{t}-{p}' for t, p in missing)}")
                raise InvalidOptionError(f"option {spec.option!r} {problem}: give every partition of the "
                                         "subscribed topics (-2 earliest, -1 latest)")
            if spec.kind == "offsets":
                symbolic = {tp: v for tp, v in named.items() if v in (EARLIEST, LATEST)}
                resolved = self._list(symbolic)
                return {tp: resolved[tp] if tp in symbolic else v for tp, v in named.items()
                        if tp in resolved or tp not in symbolic}
            times = named
        return self._by_time(times, spec.option, starting)

    def _by_time(self, times: dict[TopicPartition, int], option: str, starting: bool) -> PartitionOffsets:
        """Offsets for record times. A partition with no record at or after its time: an ending
        read goes to the latest offset; a starting one fails or starts at the latest offset
        (startingOffsetsByTimestampStrategy), as in Kafka."""
        found = self._list_offsets(times)
        without = [tp for tp, (offset, _) in found.items() if offset < 0]
        if without and starting and self.options.by_timestamp_strategy == STRATEGY_ERROR:
            tp = without[0]
            raise InvalidOptionError(f"option {option!r}: {tp[0]}-{tp[1]} has no record at or after time {times[tp]} "
                                     "(set startingOffsetsByTimestampStrategy=latest to start at the latest offset)")
        latest = self.latest(without)
        return {tp: offset if offset >= 0 else latest[tp] for tp, (offset, _) in found.items()
                if offset >= 0 or tp in latest}

    def _list(self, positions: dict[TopicPartition, int]) -> PartitionOffsets:
        return {tp: offset for tp, (offset, _) in self._list_offsets(positions).items()} if positions else {}

    def _list_offsets(self, positions: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets: (offset, timestamp) for EARLIEST, LATEST or a time in ms (offset -1: no
        record at or after it). Every question this reader asks ends here."""
        by_topic: dict[str, dict[TopicPartition, int]] = {}
        for tp, position in positions.items():
            by_topic.setdefault(tp[0], {})[tp] = position

        def ask(topics: list[str]) -> dict[str, dict[TopicPartition, tuple[int, int]]]:
            found = self.admin.list_offsets({tp: ts for t in topics for tp, ts in by_topic[t].items()},
                                            self.options.isolation_level)
            return {t: {tp: found[tp] for tp in by_topic[t]} for t in topics}

        answers = self._per_topic(ask, sorted(by_topic))
        return {tp: answer for per_topic in answers.values() for tp, answer in per_topic.items()}

    def _per_topic(self, ask: Callable[[list[str]], dict[str, A]], topics: list[str]) -> dict[str, A]:
        """`ask(topics)`, or when a metadata race fails it, `ask([topic])` for each topic alone,
        leaving out the topics that fail again: one request in the common case, and a race
        costs only its topic's answer."""
        if not topics:
            return {}
        try:
            return ask(topics)
        except (*METADATA_RACES, AdminError) as err:
            if isinstance(err, AdminError) and not all(isinstance(e, METADATA_RACES) for e in err.errors.values()):
                raise
            if len(topics) == 1:
                _no_answer(topics[0], err)
                return {}
        out: dict[str, A] = {}
        for topic in topics:
            try:
                out.update(ask([topic]))
            except METADATA_RACES as err:
                _no_answer(topic, err)
        return out


def _no_answer(topic: str, err: Exception) -> None:
    log.info("%s: no answer this time (%s: deleted, re-created or changing leader?)", topic, err)


def _admin_settings(options: SourceOptions) -> dict[str, int]:
    """The driver's admin settings among the query's `kafka.*` options: the request timeout, and
    how long its lookups wait out brokers that cannot be reached (a restart), as Kafka's source
    does for `default.api.timeout.ms` (60 s unless set)."""
    names = ("request_timeout_ms", "retry_backoff_ms", "default_api_timeout_ms")
    return {name: options.client[name] for name in names if options.client.get(name)}
