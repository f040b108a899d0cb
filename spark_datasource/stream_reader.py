"""`spark.readStream.format("pymq")`: micro-batches of offset ranges, checkpointed by Spark.

Offsets are the Spark Kafka source's, exactly: `{"topic": {"partition": next_offset}}`, every
inner key a partition number and every value an int, in the checkpoint's `offsets/N` files, in
`StreamingQueryProgress.sources[].startOffset/endOffset/latestOffset`, and as `startingOffsets`
JSON (a query's end fed to another query starts it there). Code that parses Kafka's offsets
parses these.

Which incarnation of a topic name the offsets belong to (its topic id) is kept out of them, by
the reader (`TopicIdLedger`): Spark 4.2 gives a Python source no metadata log (PythonScan drops
the checkpoint location) and no per-source state beside the offsets, and any entry inside them
(an inner `topicId` key, as checkpoints written before this held; or a top-level entry that is
not a topic) breaks Kafka's parsers or shows them a topic that does not exist. The reader is one
long-running Python process on the driver, so it remembers the ids of the offsets it hands to
Spark for as long as the query runs; a restarted query starts from the checkpoint's offsets and
the topics as they are then (as Kafka's source does: a topic re-created while the query was
stopped is told only by offsets that went back). Offsets checkpointed with the inline `topicId`
keys resume, and their ids are still compared. The reader also keeps what admission control
needs between triggers (when the last batch was cut, the Trigger.AvailableNow target).

- `initialOffset`: the starting options (default `latest`) over the partitions that exist now.
- `latestOffset(start, limit)`: the subscription is looked up again (new topics matching
  `subscribePattern`, partitions added with CreatePartitions), new partitions are read from their
  earliest offset, and the end is cut by the read limit: `maxOffsetsPerTrigger` rows split across
  partitions in proportion to their backlog (Kafka's rule), `minOffsetsPerTrigger` waits for enough
  rows unless `maxTriggerDelay` has passed since the last batch.
- `partitions(start, end)`: one task per partition range, split like batch reads.
- `groupIdForLag`: the end of each finished micro-batch (`start` of `latestOffset`, and
  `commit(end)`) is committed to that consumer group for lag reporting (`lag_group.py`).
- Data loss (offsets deleted by retention before they were read, a partition whose log went
  backwards, a deleted topic) fails the query naming topic, partition and offsets
  (`failOnDataLoss=true`) or is logged with the count of offsets skipped.
- Metadata races (a topic deleted or re-created, or its leader moving, between the lookups of one
  call; `offsets.METADATA_RACES`) leave a partition without an answer: `latestOffset` keeps it
  where it is (no new data this trigger; the next trigger asks again), and planning reads a new
  partition whose start got no answer from offset 0, so the read finds what is gone. Whether a
  topic is gone is decided by the topic listing alone, and data loss follows failOnDataLoss.
- A topic deleted and re-created since the query's position (its id changed), whatever its
  offsets now, is data loss too: the first trigger that sees it leaves the topic out of its end,
  as for a deleted topic (its old and new offsets may be equal, and Kafka's form cannot tell
  them apart), so planning reports the loss (failOnDataLoss=true fails naming both ids); the
  next trigger finds it as a new topic, read from its earliest offset. Each planned range
  carries its topic id, so a task never reads another incarnation (`task.py`).
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from common.errors import DataLossError
from common.topic_partition import TopicPartition
from spark_datasource.lag_group import LagGroup
from spark_datasource.offsets import OffsetReader, PartitionOffsets
from spark_datasource.options import SourceOptions
from spark_datasource.ranges import OffsetRange, RangePartition, split_ranges
from spark_datasource.task import read_offset_range

log = logging.getLogger("pymq.spark.stream")

Offsets = dict[str, dict[str, int]]  # Spark Kafka's form, what Spark checkpoints and reports
TopicIds = dict[str, str]
# Where checkpoints written before the ids left the offsets kept a topic's id (beside its
# partitions): read, never written.
LEGACY_TOPIC_ID = "topicId"


def to_json(offsets: PartitionOffsets) -> Offsets:
    """Spark Kafka's form of `offsets`: `{topic: {partition: offset}}`."""
    out: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: Offsets) -> PartitionOffsets:
    """The positions in `offsets`, Kafka's form or the legacy one with inline topic ids."""
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()
            if p != LEGACY_TOPIC_ID}


class TopicIdLedger:
    """The topic ids of the offsets this reader handed to Spark: which incarnation of each topic
    name their positions belong to, so a topic deleted and re-created between two triggers is
    told from new records (the offsets alone cannot tell them apart).

    Spark gives the reader back only offsets it handed out before (the start and end of the
    batch it plans, the start of the next trigger), so the ledger keeps the last `capacity`
    offsets it recorded, by their JSON, and forgets older ones (a query runs for months). Offsets
    it never recorded (a restarted query's checkpoint) have the ids they carry inline (legacy
    checkpoints) or none, and a topic without an id is not compared."""

    def __init__(self, capacity: int = 16) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, TopicIds] = OrderedDict()

    def record(self, offsets: Offsets, ids: TopicIds) -> Offsets:
        """Remember that `offsets` are positions in the topics `ids` names; returns `offsets`."""
        key = _key(offsets)
        self._ids[key] = {topic: ids[topic] for topic in offsets if topic in ids}
        self._ids.move_to_end(key)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return offsets

    def ids_of(self, offsets: Offsets) -> TopicIds:
        """The topic ids `offsets` belong to, as far as known."""
        inline = {topic: str(parts[LEGACY_TOPIC_ID]) for topic, parts in offsets.items() if LEGACY_TOPIC_ID in parts}
        return {**inline, **self._ids.get(_key(offsets), {})}


def _key(offsets: Offsets) -> str:
    return json.dumps(offsets, sort_keys=True)


def recreated(before: TopicIds, now: TopicIds) -> set[str]:
    """The topics whose id changed: deleted and created again in between. A topic without an
    id on either side is not compared."""
    return {topic for topic, topic_id in before.items() if now.get(topic, topic_id) != topic_id}


def rate_limit(start: PartitionOffsets, latest: PartitionOffsets, max_rows: int) -> PartitionOffsets:
    """Ends that admit at most about `max_rows` rows, shared by backlog (Kafka's rateLimit: each
    partition's share rounded down, or up when under one row so a small backlog still moves)."""
    backlog = {tp: max(end - start.get(tp, end), 0) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_rows * backlog[tp] / total
        out[tp] = min(end, begin + (math.ceil(share) if share < 1 else math.floor(share)))
    return out


@dataclass(frozen=True)
class Latest:
    """The partitions the subscription has (`listed`), the latest offsets of those that got an
    answer (`offsets`; a metadata race leaves a partition out) and their topics' ids."""

    listed: list[TopicPartition]
    offsets: PartitionOffsets
    topic_ids: TopicIds

    def ends(self, begin: PartitionOffsets) -> PartitionOffsets:
        """Where a batch that starts at `begin` may end. A partition that is not listed any more
        (topic deleted) is left out: the end then differs from the start, so a batch is planned
        and `partitions` reports the loss (kept at its old position, an idle query never planned
        a batch and the deletion went unreported; Kafka's source drops it the same way). A listed
        partition without an answer stays at `begin` (no new data this trigger), or, new, waits
        for the next trigger."""
        unanswered = [tp for tp in self.listed if tp not in self.offsets]
        if unanswered:
            log.info("no latest offset for %s this trigger (metadata race); asking again next trigger", unanswered)
        held = {tp: begin[tp] for tp in unanswered if tp in begin}
        return {tp: self.offsets[tp] if tp in self.offsets else held[tp] for tp in self.listed
                if tp in self.offsets or tp in held}


class PymqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._offsets = OffsetReader(options)
        self._latest: Offsets | None = None  # for reportLatestOffset
        self._target: Latest | None = None  # Trigger.AvailableNow: never read past these
        self._last_batch_s = -math.inf  # the first trigger never waits for minOffsetsPerTrigger (Kafka's rule)
        self._topic_ids = TopicIdLedger()
        self._lag = (LagGroup(options.group_id_for_lag, options.bootstrap_servers)
                     if options.group_id_for_lag is not None else None)

    # -- offsets -----------------------------------------------------------------------------

    def initialOffset(self) -> Offsets:
        tps = self._offsets.topic_partitions(missing_ok=True)
        return self._topic_ids.record(to_json(self._offsets.resolve(self.options.starting, tps, starting=True)),
                                      self._ids(tps))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_now()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        begin = from_json(start)
        # Spark plans one batch at a time: `start` is where the last finished batch ended (or
        # where the query starts), and this call also comes when no batch follows it.
        self._report_position(begin)
        target = self._target if self._target is not None else self._latest_now()
        # A re-created topic leaves the offsets this trigger, as a deleted one does (`partitions`
        # reports the loss), and comes back at the next as a new topic, read from its start: its
        # new offsets, in Kafka's form, could equal the old ones and plan no batch at all.
        gone = recreated(self._topic_ids.ids_of(start), target.topic_ids)
        if gone:
            log.info("%s deleted and re-created since the last trigger; read again from its start next trigger",
                     ", ".join(sorted(gone)))
        begin = {tp: offset for tp, offset in begin.items() if tp[0] not in gone}
        available = target.ends(begin)
        self._latest = to_json(available)
        latest = {tp: offset for tp, offset in available.items() if tp[0] not in gone}
        if isinstance(limit, ReadAllAvailable):
            return self._advance(begin, latest, target.topic_ids)
        new = [tp for tp in latest if tp not in begin]
        since = {**self._offsets.earliest(new), **begin} if new else begin  # new partitions: from their start
        # Spark passes one limit; the options may set both bounds (Kafka's composite limit).
        if self._target is None and self.options.min_offsets_per_trigger is not None:
            backlog = sum(max(end - since.get(tp, end), 0) for tp, end in latest.items())
            waited_ms = (time.monotonic() - self._last_batch_s) * 1000
            if backlog < self.options.min_offsets_per_trigger and waited_ms < self.options.max_trigger_delay_ms:
                return start  # Spark gives it back next trigger; the ledger has its ids (or it has them inline)
        max_rows = self.options.max_offsets_per_trigger or (limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        if max_rows is not None:
            latest = rate_limit(since, latest, max_rows)
        return self._advance(begin, latest, target.topic_ids)

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def _latest_now(self) -> Latest:
        """Every partition the subscription has now, at its latest offset (`Latest.ends`)."""
        listed = self._offsets.topic_partitions(missing_ok=True)
        return Latest(listed, self._offsets.latest(listed), self._ids(listed))

    def _ids(self, tps: list[TopicPartition]) -> TopicIds:
        """The ids of the topics of `tps`, as the listing that found them described them."""
        ids = self._offsets.topic_ids
        return {topic: ids[topic] for topic, _ in tps if topic in ids}

    def _advance(self, begin: PartitionOffsets, end: PartitionOffsets, topic_ids: TopicIds) -> Offsets:
        if end != begin:
            self._last_batch_s = time.monotonic()
        return self._topic_ids.record(to_json(end), topic_ids)

    # -- planning and reading ----------------------------------------------------------------

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        existing = set(self._offsets.topic_partitions(missing_ok=True))
        # The ids `end` was cut on; offsets this reader did not hand out (a restarted query
        # re-planning a checkpointed batch) are read from the topics as they are now.
        ids = {**self._ids(list(stop)), **self._topic_ids.ids_of(end)}
        self._forget_recreated(begin, self._topic_ids.ids_of(start), {**self._offsets.topic_ids, **ids})
        new = [tp for tp in stop if tp not in begin]
        if new:  # discovered since the last batch (a new topic or partition): read from its start
            earliest = self._offsets.earliest(new)
            for tp, offset in sorted(earliest.items()):
                if offset > 0:  # retention deleted records before the query saw the partition
                    self._lost(tp, f"new partition {tp[0]}-{tp[1]} starts at offset {offset}, not 0", 0, offset)
            # No answer (a metadata race): from offset 0, where the read finds any loss itself.
            begin.update({tp: earliest.get(tp, 0) for tp in new})
        for tp in sorted(begin.keys() - stop.keys()):  # gone: latestOffset leaves deleted partitions out
            self._lost(tp, f"{tp[0]}-{tp[1]} no longer exists (topic deleted?) after offset {begin[tp]}",
                       begin[tp], begin[tp])
        ranges = []
        for tp, until in stop.items():
            since = begin[tp]
            if tp not in existing:
                self._lost(tp, f"{tp[0]}-{tp[1]} no longer exists (topic deleted?)", since, until)
                continue
            if until < since:
                self._lost(tp, f"{tp[0]}-{tp[1]}'s log went back from offset {since} to {until}", until, since)
                continue
            ranges.append(OffsetRange(tp[0], tp[1], since, until, ids.get(tp[0])))
        return [RangePartition(r) for r in split_ranges(ranges, self.options.min_partitions,
                                                        self.options.max_records_per_partition)]

    def _forget_recreated(self, begin: PartitionOffsets, before: TopicIds, now: TopicIds) -> None:
        """Report the partitions of topics re-created since `begin` as lost, and drop them from
        `begin`: their offsets belonged to the old topic, the new one is read from its start."""
        gone = recreated(before, now)
        for tp in sorted(tp for tp in begin if tp[0] in gone):
            self._lost(tp, f"{tp[0]}-{tp[1]}: the topic was deleted and re-created after offset {begin[tp]} "
                       f"(topic id {before[tp[0]]}, now {now[tp[0]]})", begin[tp], begin[tp])
            del begin[tp]

    def _lost(self, tp: TopicPartition, what: str, start: int, end: int) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{what}: offsets may have been lost (failOnDataLoss=true; set it to false "
                                "to go on)", tp[0], tp[1], start, end)
        log.warning("%s: offsets may have been lost; going on (failOnDataLoss=false)", what)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())
        return read_offset_range(self.options, partition.range)

    def commit(self, end: Offsets) -> None:
        """Spark finished the batch that ends at `end` (it says so when it plans the next one).
        Progress lives in Spark's checkpoint; with groupIdForLag the end is also committed to
        the group, for lag reporting only."""
        self._report_position(from_json(end))

    def _report_position(self, offsets: PartitionOffsets) -> None:
        if self._lag is not None:
            self._lag.commit(offsets)

    def stop(self) -> None:
        try:
            if self._lag is not None:
                self._lag.close()
        finally:
            self._offsets.close()
