"""`spark.read.format("pymq")`: a bounded read of topics, one Spark task per offset range.

Planning (driver): the subscription's partitions, each one's [start, end) from
startingOffsets/endingOffsets (or their timestamp forms), split by `ranges.split_ranges`.
Reading (executors): `task.read_offset_range`.

No filter is pushed down: Spark evaluates every filter on the rows read. Spark 4.2 keeps the
read a source plans (its partitions and read function) on the DataFrame's relation, one for
every query on that DataFrame: a read narrowed by one query's pushed filters was served to the
next query of the same DataFrame (an unfiltered count after `partition = 0 AND offset >= 1081`
returned that query's rows), and to both sides of a union of two filters on it. A plan is
therefore the same for every query: the DataFrame's whole offset ranges. To read less, bound the
read with the options (`assign`, `startingOffsets`, `endingOffsets`, `startingTimestamp`, ...),
or read a table topic's history, whose table Spark prunes natively (`pymq.history`).

With `remoteStorage.url`, the part of each range the remote tier holds is planned from the
partitions' manifests instead: a task per run of remote segments, cut by
`maxRecordsPerPartition` and `minPartitions` as broker ranges are, read by executors from the
object store (`remote_ranges.py`); only the rest is fetched from the brokers.

With `remoteStorage.only=true` no broker is contacted at all: the partitions, earliest and latest
come from the store's manifests and time lookups from its segments' time indexes
(`remote_ranges.RemoteOffsetReader`), and only tiered offsets are read (up to each manifest's
`log_end_offset`).

A partition that gets no answer while the read is planned (its topic deleted or re-created, or
its leader moving, between the lookups: `offsets.METADATA_RACES`) is data the read cannot have:
DataLossError (failOnDataLoss=true), or left out with a warning (false). Each planned range
carries its topic's id, so a topic re-created after planning is never read in its place
(`task.py`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from common.errors import DataLossError
from common.topic_partition import TopicPartition
from spark_datasource.offsets import OffsetReader
from spark_datasource.options import InvalidOptionError, SourceOptions
from spark_datasource.ranges import OffsetRange, RangePartition, split_ranges
from spark_datasource.remote_ranges import (
    RemoteOffsetReader,
    RemoteRangePartition,
    check_remote_start,
    plan_remote,
    read_remote_range,
    split_partitions,
)
from spark_datasource.task import read_offset_range

log = logging.getLogger("pymq.spark.batch")


class PymqBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        if opts.remote_storage_url is None:
            return [RangePartition(r) for r in self.plan()]
        if opts.remote_storage_only:
            offsets = RemoteOffsetReader(opts)
            remote, rest = plan_remote(opts, self.offset_ranges(offsets), manifests=offsets.manifests)
            left = [r for r in rest if r.size]
            assert not left, f"remoteStorage.only planned offsets the store does not hold: {left}"
        else:
            offsets = OffsetReader(opts)
            remote, rest = plan_remote(opts, self.offset_ranges(offsets), topic_ids=offsets.topic_ids)
        return split_partitions(remote, rest, opts.min_partitions, opts.max_records_per_partition)

    def plan(self) -> list[OffsetRange]:
        """The offset ranges this read covers, split for Spark tasks (all read from brokers)."""
        return split_ranges(self.offset_ranges(), self.options.min_partitions, self.options.max_records_per_partition)

    def offset_ranges(self, offsets: OffsetReader | None = None) -> list[OffsetRange]:
        """Each planned partition's [start, end) (maybe empty).
        `offsets` answers the questions (default: the brokers, through an OffsetReader, or the
        store alone with remoteStorage.only)."""
        remote_only = self.options.remote_storage_only
        if offsets is None:
            offsets = RemoteOffsetReader(self.options) if remote_only else OffsetReader(self.options)
        try:
            tps = offsets.topic_partitions(missing_ok=False)
            starts = offsets.resolve(self.options.starting, tps, starting=True)
            ends = offsets.resolve(self.options.ending, tps, starting=False)
            # An explicit ending offset past the end is a mistake in the option: the task would
            # find the offsets missing and report them as data loss ("truncated?").
            latest = offsets.latest(tps) if self.options.ending.kind == "offsets" else ends
            earliest = offsets.earliest(tps) if remote_only else {}
        finally:
            offsets.close()
        answers = [starts, ends, latest, *([earliest] if remote_only else [])]
        ranges = []
        for tp in tps:
            if any(tp not in answer for answer in answers):
                self._unanswered(tp)
                continue
            start, end = starts[tp], ends[tp]
            if end > latest[tp]:
                raise InvalidOptionError(
                    f"{tp[0]}-{tp[1]}: ending offset {end} (option {self.options.ending.option}) is after the "
                    f"partition's {'remote log end' if remote_only else 'latest'} offset {latest[tp]}")
            if start > end:
                raise InvalidOptionError(
                    f"{tp[0]}-{tp[1]}: starting offset {start} (option {self.options.starting.option}) is after "
                    f"ending offset {end} (option {self.options.ending.option})")
            r = OffsetRange(tp[0], tp[1], start, end, offsets.topic_ids.get(tp[0]))
            ranges.append(check_remote_start(self.options, r, earliest[tp]) if remote_only else r)
        return ranges

    def _unanswered(self, tp: TopicPartition) -> None:
        what = (f"{tp[0]}-{tp[1]}: no offsets while the read was planned (the topic was deleted or re-created, "
                "or its leader moved, meanwhile)")
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{what}: its records may be gone (failOnDataLoss=true; set it to false to "
                                "read the other partitions)", tp[0], tp[1])
        log.warning("%s: not read (failOnDataLoss=false)", what)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RemoteRangePartition):
            return read_remote_range(self.options, partition)
        if not isinstance(partition, RangePartition):  # Spark's placeholder when nothing was planned
            return iter(())
        return read_offset_range(self.options, partition.range)
