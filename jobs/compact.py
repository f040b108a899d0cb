"""`pymq job compact TOPIC... --remote-storage URL`: compaction of a compacted topic's tiered history.

Kafka compacts only what a broker holds on disk; tiered segments stay as they were sealed. This
job compacts them with Spark, without routing a byte through the brokers:

1. The driver reads each partition's manifest from the store (the layout is public,
   docs/architecture.md) and the topic's `cleanup.policy`, `delete.retention.ms` and
   `segment.bytes` from a broker.
2. One Spark task per partition downloads the partition's remote segments, builds the offset map
   (each key's latest offset, segment_format.compaction) over all of them, and rewrites every
   segment but the last (which, like Kafka's active segment, is never compacted: the log end must
   not move) keeping each key's latest record, and its tombstone until `delete.retention.ms` has
   passed since the tombstone's timestamp. Offsets are kept, with gaps. Small results are merged
   into segments of up to `segment.bytes`, written in the pymq segment format with their indexes
   (SegmentWriter) and uploaded as new objects (verified by size and CRC32C).
3. The driver asks the partition's leader to swap them in (ReplaceRemoteSegments): one manifest
   commit, guarded by the manifest version the task read. The broker stays the only manifest
   writer. If the broker changed the manifest meanwhile (a new upload, retention), the swap fails
   with StaleManifestError and changes nothing; the job deletes its objects and compacts that
   partition again from the new manifest, up to `conflict_retries` times (conf/jobs.toml), then
   reports the conflict.

A job killed at any point leaves every manifest as it was or swapped whole: objects it uploaded and
no manifest names are removed by the broker's orphan cleaning. The replaced objects are left to
that cleaning too (after its grace period), so readers that planned on the old manifest finish.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from pyspark.sql import SparkSession
from rich.table import Table

from client import Admin
from common.cli_options import KeyValue, bootstrap, bootstrap_option
from common.cli_options import console as cli_console
from common.cli_options import spark_conf_option
from common.errors import PymqError, StaleManifestError
from jobs.job_config import job_defaults
from segment_format import batch_body, record
from segment_format.compaction import CompactionStats, build_offset_map, compact_batches
from segment_format.layout import SegmentFiles
from segment_format.manifest import RemoteSegment
from segment_format.segment_reader import SegmentReader, file_pread
from segment_format.segment_writer import SegmentWriter
from spark_datasource.session import local_spark
from tiered_storage import RemoteSegmentStore

console = cli_console(stderr=True)


@dataclass(frozen=True)
class PartitionPlan:
    """What one task compacts: plain values, pickled to a Spark worker."""

    topic: str
    partition: int
    topic_id: str
    manifest_version: int
    segments: tuple[dict[str, Any], ...]  # the manifest's remote segments (RemoteSegment.to_dict), oldest first
    store_url: str
    store_options: tuple[tuple[str, str], ...]
    now_ms: int
    delete_retention_ms: int
    max_keys: int
    segment_bytes: int


@dataclass
class PartitionResult:
    topic: str
    partition: int
    manifest_version: int
    replaced: list[tuple[int, str]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)  # uploaded, not yet named by any manifest
    segments_in: int = 0
    records_in: int = 0
    records_kept: int = 0
    tombstones_removed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    status: str = "unchanged"


def store_of(url: str, options: tuple[tuple[str, str], ...]) -> RemoteSegmentStore:
    return RemoteSegmentStore.from_url(url, dict(options))


def compact_partition(plan: PartitionPlan) -> PartitionResult:
    """One partition's remote segments compacted and uploaded (runs in a Spark task)."""
    started = time.perf_counter()
    store = store_of(plan.store_url, plan.store_options)
    segments = [RemoteSegment.from_dict(s) for s in plan.segments]
    result = PartitionResult(plan.topic, plan.partition, plan.manifest_version)
    work = Path(tempfile.mkdtemp(prefix="pymq-compact-"))
    try:
        local = [_download(store, plan, segment, work) for segment in segments]
        offset_map = build_offset_map(_batches(local, segments), plan.max_keys)
        # Compact the segments the map covers wholly, except the last remote segment.
        run = [s for s in segments[:-1] if s.next_offset <= offset_map.end_offset]
        if not run:
            return result
        stats = CompactionStats()
        compacted = compact_batches(_batches(local[:len(run)], run), offset_map, plan.now_ms, plan.delete_retention_ms,
                                    stats=stats)
        written = list(_write_segments(compacted, run, plan.segment_bytes, work / "out"))
        result.segments_in, result.records_in, result.bytes_in = len(run), stats.records_in, stats.bytes_in
        result.records_kept, result.tombstones_removed = stats.records_kept, stats.tombstones_removed
        if stats.records_kept == stats.records_in and len(written) == len(run):
            return result  # nothing to remove, nothing to merge: leave the tier alone
        result.replaced = [(s.base_offset, s.upload_id) for s in run]
        for files, metadata in written:
            uploaded = store.upload_segment(plan.topic, plan.partition, files, metadata)
            result.segments.append(uploaded.to_dict())
            result.bytes_out += uploaded.size_bytes
        result.status = "compacted"
        return result
    finally:
        result.seconds = round(time.perf_counter() - started, 2)
        shutil.rmtree(work, ignore_errors=True)


def _download(store: RemoteSegmentStore, plan: PartitionPlan, segment: RemoteSegment, work: Path) -> Path:
    path = work / segment.log.name
    store.fs.get_file(store.object_path(plan.topic, plan.partition, segment.log), str(path))
    return path


def _batches(paths: list[Path], segments: list[RemoteSegment]) -> Iterator[Any]:
    for path, segment in zip(paths, segments):
        with path.open("rb") as file:
            reader = SegmentReader(file_pread(file), segment.base_offset, size=segment.size_bytes, name=str(path))
            yield from reader.stored_batches()


def _write_segments(batches: Iterator[Any], run: list[RemoteSegment], segment_bytes: int, out: Path) -> Iterator[Any]:
    """The compacted batches as segments of up to `segment_bytes`, each based at the base offset
    of the input segment its first batch came from; (SegmentFiles, SegmentMetadata) each."""
    out.mkdir(parents=True, exist_ok=True)
    bases = [s.base_offset for s in run]
    writer = files = None
    opened: list[Any] = []
    for data in batches:
        offset = record.read_header(data).base_offset
        if writer is not None and writer.size + len(data) > segment_bytes and writer.size:
            yield files, _close(writer, opened)
            writer = None
        if writer is None:
            base = max(b for b in bases if b <= offset)
            files = SegmentFiles(out, base)
            opened = [files.log.open("wb"), files.index.open("wb"), files.time_index.open("wb")]
            writer = SegmentWriter(*opened, base)
        writer.append(data)
    if writer is not None:
        yield files, _close(writer, opened)


def _close(writer: SegmentWriter, opened: list[Any]) -> Any:
    metadata = writer.close()
    for file in opened:
        file.close()
    return metadata


def plan_topic(admin: Admin, store: RemoteSegmentStore, url: str, options: tuple[tuple[str, str], ...], topic: str,
               max_keys: int, now_ms: int) -> tuple[list[PartitionPlan], str | None]:
    """The partitions of `topic` worth compacting, or why none is."""
    configs = {k: v["value"] for k, v in admin.describe_configs([topic])[topic].items()}
    if "compact" not in str(configs.get("cleanup.policy", "")):
        return [], f"cleanup.policy is {configs.get('cleanup.policy')}, not compact"
    description = admin.describe_topics([topic])[0]
    plans = []
    for info in description.partitions:
        manifest = store.load_manifest(topic, info.partition, description.topic_id)
        if len(manifest.segments) > 1:
            plans.append(PartitionPlan(topic, info.partition, description.topic_id, manifest.version,
                                       tuple(s.to_dict() for s in manifest.segments), url, options, now_ms,
                                       int(configs.get("delete.retention.ms", 86_400_000)), max_keys,
                                       int(configs.get("segment.bytes", 1 << 30))))
    return plans, None if plans else "no partition has more than one remote segment"


def swap(admin: Admin, store: RemoteSegmentStore, result: PartitionResult, topic_id: str) -> None:
    """Ask the leader to swap the result in; on any refusal delete the uploaded objects."""
    segments = [RemoteSegment.from_dict(s) for s in result.segments]
    try:
        result.manifest_version = admin.replace_remote_segments(result.topic, result.partition, result.manifest_version,
                                                                result.replaced, segments, topic_id)
        result.status = "swapped"
    except Exception:
        for segment in segments:
            try:
                store.delete_segment(result.topic, result.partition, segment)
            except Exception:  # orphan cleaning removes what is left
                pass
        raise


def compact(spark: SparkSession, topics: list[str], bootstrap_servers: str, url: str, options: dict[str, str], *,
            max_keys: int | None = None, conflict_retries: int | None = None, now_ms: int | None = None) -> list[PartitionResult]:
    """Compact the tiered history of `topics`; a result per partition considered."""
    defaults = job_defaults("compact")
    max_keys = max_keys or int(defaults["max_keys"])
    retries = conflict_retries if conflict_retries is not None else int(defaults["conflict_retries"])
    store_options = tuple(sorted(options.items()))
    store = store_of(url, store_options)
    results: list[PartitionResult] = []
    with Admin(bootstrap_servers) as admin:
        pending: list[PartitionPlan] = []
        for topic in topics:
            plans, why_not = plan_topic(admin, store, url, store_options, topic, max_keys, now_ms or batch_body.now_ms())
            if why_not:
                console.print(f"{topic}: nothing to compact ({why_not})")
            pending += plans
        for attempt in range(retries + 1):
            if not pending:
                break
            retry: list[PartitionPlan] = []
            tasks = spark.sparkContext.parallelize(pending, len(pending)).map(compact_partition)
            by_key = {(p.topic, p.partition): p for p in pending}
            for result in tasks.toLocalIterator():
                plan = by_key[(result.topic, result.partition)]
                if result.status == "compacted":
                    try:
                        swap(admin, store, result, plan.topic_id)
                    except StaleManifestError as err:
                        if attempt < retries:
                            console.print(f"{result.topic}-{result.partition}: the manifest changed ({err}); compacting again")
                            retry += plan_topic_partition(admin, store, plan, now_ms)
                            continue
                        result.status = f"conflict: {err}"
                    except PymqError as err:  # refused or unreachable: the other partitions go on
                        result.status = f"not swapped: {type(err).__name__}: {err}"
                console.print(f"{result.topic}-{result.partition}: {result.status}, {result.records_in:,} records in "
                              f"{result.segments_in} segments -> {result.records_kept:,} ({result.seconds}s)")
                results.append(result)
            pending = retry
    return results


def plan_topic_partition(admin: Admin, store: RemoteSegmentStore, plan: PartitionPlan, now_ms: int | None) -> list[PartitionPlan]:
    """`plan` again, on the partition's manifest as it is now."""
    manifest = store.load_manifest(plan.topic, plan.partition, plan.topic_id)
    if len(manifest.segments) < 2:
        return []
    return [PartitionPlan(**{**asdict(plan), "manifest_version": manifest.version,
                             "segments": tuple(s.to_dict() for s in manifest.segments),
                             "now_ms": now_ms or batch_body.now_ms()})]


def summary_table(results: list[PartitionResult]) -> Table:
    table = Table(title="compaction of the tier", header_style="bold")
    for column in ("TOPIC", "PARTITION", "SEGMENTS IN", "RECORDS IN", "KEPT", "TOMBSTONES DROPPED", "BYTES IN",
                   "BYTES OUT", "MANIFEST", "STATUS"):
        table.add_column(column, justify="left" if column in ("TOPIC", "STATUS") else "right")
    for r in results:
        table.add_row(r.topic, str(r.partition), str(r.segments_in), f"{r.records_in:,}", f"{r.records_kept:,}",
                      f"{r.tombstones_removed:,}", f"{r.bytes_in:,}", f"{r.bytes_out:,}", str(r.manifest_version), r.status)
    return table


@click.command("compact")
@click.argument("topics", nargs=-1, required=True)
@click.option("--remote-storage", "url", required=True, help="the brokers' remote.storage.url (file://..., s3://bucket/prefix)")
@click.option("-s", "--store-option", "store_options", multiple=True, type=KeyValue(), metavar="KEY=VALUE",
              help="a store option (s3fs names: endpoint_url=..., key=..., secret=..., region=...)")
@click.option("--max-keys", type=int, default=None, help="keys a task's offset map may hold [conf/jobs.toml]")
@bootstrap_option
@spark_conf_option
def compact_command(topics: tuple[str, ...], url: str, store_options: tuple[tuple[str, str], ...], max_keys: int | None,
                    spark_conf: tuple[tuple[str, str], ...]) -> None:
    """Compact the tiered history of compacted TOPICS: keep each key's latest record (tombstones
    until delete.retention.ms), offsets kept; the partitions' leaders swap the result in."""
    spark = local_spark("pymq-job-compact", **dict(spark_conf))
    try:
        results = compact(spark, list(topics), bootstrap(), url, dict(store_options), max_keys=max_keys)
    finally:
        spark.stop()
    cli_console().print(summary_table(results))


main = compact_command

if __name__ == "__main__":
    main()
