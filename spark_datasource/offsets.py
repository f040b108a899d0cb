"""Driver side of a read: which partitions it covers and where each starts and ends (Kafka's
KafkaOffsetReader).

Every question goes to the brokers through one `Admin`: the topic list (for subscribePattern),
each topic's partitions, and ListOffsets for earliest, latest and by-time positions. The answers
become plain `{topic: {partition: offset}}` maps, the same shape a streaming query checkpoints.
"""
from __future__ import annotations

from collections.abc import Iterable

from broker.client import EARLIEST, LATEST, Admin
from spark_datasource.options import STRATEGY_ERROR, InvalidOptionError, OffsetSpec, SourceOptions
from broker.topic_partition import TopicPartition

PartitionOffsets = dict[TopicPartition, int]


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
        exist is an error unless `missing_ok` (a streaming query waits for it to appear)."""
        opts = self.options
        existing = set(self.admin.list_topics())
        if opts.subscribe_pattern is not None:
            wanted = sorted(t for t in existing if opts.topic_matches(t) and not t.startswith("__"))
        else:
            wanted = list(dict.fromkeys(opts.subscribe)) if opts.subscribe else sorted(opts.assign or {})
            missing = [t for t in wanted if t not in existing]
            if missing and not missing_ok:
                raise InvalidOptionError(f"unknown topic(s) {', '.join(missing)} in option "
                                         f"{'subscribe' if opts.subscribe else 'assign'}")
            wanted = [t for t in wanted if t in existing]
        if not wanted:
            return []
        described = self.admin.describe_topics(wanted)
        self.topic_ids.update((d.name, d.topic_id) for d in described)
        counts = {d.name: len(d.partitions) for d in described}
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

    def earliest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(tps, EARLIEST))

    def latest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(tps, LATEST))

    def offsets_for_time(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """The first offset whose record time is at or after `timestamp_ms`, or None."""
        found = self._list_offsets(dict.fromkeys(tps, timestamp_ms)) if tps else {}
        return {tp: offset if offset >= 0 else None for tp, (offset, _) in found.items()}

    def resolve(self, spec: OffsetSpec, tps: list[TopicPartition], starting: bool,
                subscribed: list[TopicPartition] | None = None) -> PartitionOffsets:
        """Concrete offsets for `tps` from a starting or ending spec. A JSON spec must name every
        partition of the subscription (Kafka's rule): a partition left out has no defined place.
        `subscribed` (default `tps`) is the whole subscription when pushed-down filters read only
        some of it: the JSON is checked against it and resolved for `tps` alone."""
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
            everything = set(tps if subscribed is None else subscribed)
            unknown = sorted(set(named) - everything)
            missing = sorted(everything - set(named))
            if unknown or missing:
                problem = (f"names {', '.join(f'{t}-{p}' for t, p in unknown)}, which the subscription does not "
                           "have (no such topic or partition, or a topic it does not subscribe to)"
                           if unknown else f"leaves out {', '.join(f'{t}-{p}' for t, p in missing)}")
                raise InvalidOptionError(f"option {spec.option!r} {problem}: give every partition of the "
                                         "subscribed topics (-2 earliest, -1 latest)")
            wanted = set(tps)
            named = {tp: v for tp, v in named.items() if tp in wanted}
            if spec.kind == "offsets":
                symbolic = {tp: v for tp, v in named.items() if v in (EARLIEST, LATEST)}
                resolved = self._list(symbolic) if symbolic else {}
                return {tp: resolved.get(tp, v) for tp, v in named.items()}
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
        latest = self.latest(without) if without else {}
        return {tp: offset if offset >= 0 else latest[tp] for tp, (offset, _) in found.items()}

    def _list(self, positions: dict[TopicPartition, int]) -> PartitionOffsets:
        return {tp: offset for tp, (offset, _) in self._list_offsets(positions).items()} if positions else {}

    def _list_offsets(self, positions: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets: (offset, timestamp) for EARLIEST, LATEST or a time in ms (offset -1: no
        record at or after it). Every question this reader asks ends here."""
        return self.admin.list_offsets(positions)


def _admin_settings(options: SourceOptions) -> dict[str, int]:
    timeout = options.client.get("request_timeout_ms")
    return {"request_timeout_ms": timeout} if timeout else {}
