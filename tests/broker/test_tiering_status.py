"""DescribeTiering, `Admin.describe_tiering`, `pymq tier status` and the tiering metrics against a
real broker process tiering to a file:// store under tmp: the numbers match the store's manifest
and the local segment files; a store that cannot be used shows its failures and error; unknown
and non-tiered topics; and the pure formatting helpers of the CLI."""
from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from cli import cli
from cli.tier import human_bytes, offset_range
from client import Admin, Consumer, Producer
from client.admin import PartitionTiering
from common.errors import UnknownTopicOrPartitionError
from tiered_storage import RemoteSegmentStore
from tests.waiting import wait_until

TOPIC = "tiered"
PLAIN = "plain"
VALUE_BYTES = 100
SEGMENT_BYTES = 16 << 10


def run(*args: str) -> Result:
    """Run the CLI in-process, its output captured: not a terminal, so no table is cut to a width."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def tiering_broker(broker_factory, remote_url: str, **overrides):  # type: ignore[no-untyped-def]
    return broker_factory(**{
        "remote.log.storage.system.enable": True, "remote.storage.url": remote_url,
        "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50,
        "file.delete.delay.ms": 0, "log.flush.scheduler.interval.ms": 20, "metrics.port": 0, **overrides}).start()


def create_topics(bootstrap: str) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, configs={
            "segment.bytes": SEGMENT_BYTES, "remote.storage.enable": "true",
            "local.retention.bytes": 32 << 10, "retention.ms": -1})
        admin.create_topic(PLAIN, partitions=2, configs={"segment.bytes": SEGMENT_BYTES})


def produce(bootstrap: str, topic: str, count: int) -> None:
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
    with Producer(bootstrap, linger_ms=5) as producer:
        for chunk in range(0, count, 500):
            n = min(500, count - chunk)
            producer.send_batch(topic, pa.table({"key": [None] * n, "value": [b"v" * VALUE_BYTES] * n}, schema=schema),
                                partition=0)
        producer.flush()


def local_logs(log_dir: Path, topic: str) -> dict[int, int]:
    """base offset -> size of each local segment's .log file (a file that local retention deletes
    between the listing and its stat is gone, not an error)."""
    sizes = {}
    for path in (log_dir / f"{topic}-0").glob("*.log"):
        try:
            sizes[int(path.name[:20])] = path.stat().st_size
        except FileNotFoundError:
            continue
    return sizes


def row_of(output: str, topic: str, partition: int) -> str:
    lines = [line for line in output.splitlines() if line.split()[:2] == [topic, str(partition)]]
    assert len(lines) == 1, output
    return lines[0]


# -- pure helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize("size, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                        (5 << 20, "5.0 MiB"), (3 << 30, "3.0 GiB")])
def test_human_bytes(size: int, text: str) -> None:
    assert human_bytes(size) == text


def test_offset_range_is_half_open_or_dash() -> None:
    assert offset_range(3, 10) == "[3, 10)"
    assert offset_range(-1, -1) == "-"


HELP_CASES = [(["tier"], "Inspect tiered storage"), (["tier", "status"], "upload lag")]


@pytest.mark.parametrize("command, purpose", HELP_CASES, ids=[" ".join(c) for c, _ in HELP_CASES])
def test_help_explains_tier_commands(command: list[str], purpose: str) -> None:
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert purpose in " ".join(result.stdout.split())


# -- against a real broker ---------------------------------------------------------------------


@pytest.mark.slow
def test_status_matches_the_manifest_and_the_local_files(broker_factory, tmp_path) -> None:
    """20 batches of 500 records in 16 KiB segments, local retention 32 KiB: once every sealed
    segment is tiered and local retention is done, describe_tiering reports the store's manifest
    (range, bytes, segments, version) and the local files (range, bytes, the active segment as
    the upload lag); the CLI table and --json say the same; the metrics too."""
    broker = tiering_broker(broker_factory, f"file://{tmp_path}/remote")
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    create_topics(broker.bootstrap)
    produced = 10_000
    produce(broker.bootstrap, TOPIC, produced)
    produce(broker.bootstrap, PLAIN, 1_000)

    with Admin(broker.bootstrap) as admin:
        def settled() -> PartitionTiering | None:
            """The row, once the manifest ends at the active segment and two reads agree."""
            (first,) = admin.describe_tiering([TOPIC])
            if first.remote_log_end_offset != max(local_logs(broker.log_dir, TOPIC)) or len(local_logs(broker.log_dir, TOPIC)) > 3:
                return None
            time.sleep(0.3)  # not a wait: "settled" is two reads 0.3 s apart that agree
            (second,) = admin.describe_tiering([TOPIC])
            return first if first == second else None

        row = wait_until(settled, 60, "every sealed segment is tiered and local retention is done")
        manifest = store.load_manifest(TOPIC, 0)
        files = local_logs(broker.log_dir, TOPIC)
        assert row.topic == TOPIC and row.partition == 0 and row.tiered
        assert (row.failures, row.last_error) == (0, None)
        assert row.manifest_version == manifest.version > 0
        assert (row.remote_log_start_offset, row.remote_log_end_offset) == (0, manifest.log_end_offset)
        assert row.remote_bytes == manifest.size_bytes == sum(s.size_bytes for s in manifest.segments)
        assert row.remote_segments == len(manifest.segments) >= 10
        assert row.log_start_offset == 0
        assert row.local_log_start_offset == min(files) > 0  # local retention removed tiered segments
        assert row.log_end_offset == row.high_watermark == produced
        assert row.local_bytes == sum(files.values())
        # Not uploaded: the active segment, which starts at the remote end.
        assert row.upload_lag_offsets == produced - manifest.log_end_offset > 0
        assert row.upload_lag_bytes == sum(size for base, size in files.items() if base >= manifest.log_end_offset)

        everything = admin.describe_tiering()
        assert [(r.topic, r.partition) for r in everything] == [(PLAIN, 0), (PLAIN, 1), (TOPIC, 0)]
        assert everything[2] == row

    result = run("-b", broker.bootstrap, "tier", "status", TOPIC)
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split()
    assert header == ["TOPIC", "PARTITION", "LOCAL", "REMOTE", "LOCAL-BYTES", "REMOTE-BYTES", "SEGMENTS",
                      "UPLOAD-LAG", "STATUS"]
    line = row_of(result.stdout, TOPIC, 0)
    assert f"[{row.local_log_start_offset}, {produced})" in line
    assert f"[0, {row.remote_log_end_offset})" in line
    assert human_bytes(row.local_bytes) in line and human_bytes(row.remote_bytes) in line
    assert f" {row.remote_segments} " in line
    assert f"{row.upload_lag_offsets} ({human_bytes(row.upload_lag_bytes)})" in line
    assert line.rstrip().endswith(" ok")

    result = run("-b", broker.bootstrap, "tier", "status", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [dataclasses.asdict(r) for r in everything]

    result = run("-b", broker.bootstrap, "tier", "status")
    assert result.exit_code == 0, result.output
    assert row_of(result.stdout, PLAIN, 1).rstrip().endswith("not tiered")

    metrics = broker.metrics()
    labels = f'{{partition="0",topic="{TOPIC}"}}'
    assert metrics[f"pymq_remote_log_start_offset{labels}"] == 0
    assert metrics[f"pymq_remote_log_end_offset{labels}"] == row.remote_log_end_offset
    assert metrics[f"pymq_remote_log_size_bytes{labels}"] == row.remote_bytes
    assert metrics[f"pymq_remote_log_segments{labels}"] == row.remote_segments
    assert metrics[f"pymq_tiering_upload_lag_bytes{labels}"] == row.upload_lag_bytes
    assert metrics[f"pymq_tiering_upload_lag_offsets{labels}"] == row.upload_lag_offsets
    assert metrics[f"pymq_tiering_failures_in_a_row{labels}"] == 0
    assert metrics["pymq_tiering_uploaded_segments_total"] >= row.remote_segments
    assert metrics["pymq_tiering_failures_total"] == 0
    assert "pymq_tiering_expired_segments_total" in metrics
    assert not any(f'topic="{PLAIN}"' in name for name in metrics if name.startswith(("pymq_remote", "pymq_tiering")))

    # A consumer from offset 0 makes the broker read the remote tier: its reader's metrics move.
    assert metrics["pymq_remote_reads_total"] == 0
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), 0)
        read = 0
        deadline = time.monotonic() + 30
        while read < produced:
            assert time.monotonic() < deadline
            read += consumer.poll_arrow(timeout_ms=500).num_rows
    metrics = broker.metrics()
    assert metrics["pymq_remote_reads_total"] >= 1 and metrics["pymq_remote_read_errors_total"] == 0
    assert metrics["pymq_remote_read_cache_bytes"] > 0 and metrics["pymq_remote_read_cache_hits_total"] > 0


@pytest.mark.slow
def test_unknown_and_non_tiered_topics(broker_factory, tmp_path) -> None:
    """An unknown topic is UNKNOWN_TOPIC_OR_PARTITION (the Admin raises it, the CLI exits 1); a
    topic without remote.storage.enable is not tiered: remote fields -1 / 0, no lag."""
    broker = tiering_broker(broker_factory, f"file://{tmp_path}/remote")
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(PLAIN, partitions=1)
        produce(broker.bootstrap, PLAIN, 100)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_tiering(["no-such-topic"])
        with pytest.raises(UnknownTopicOrPartitionError):  # after the known one was asked too
            admin.describe_tiering([PLAIN, "no-such-topic"])
        (row,) = admin.describe_tiering([PLAIN])
    assert row == PartitionTiering(
        PLAIN, 0, tiered=False, log_start_offset=0, local_log_start_offset=0, log_end_offset=100, high_watermark=100,
        local_bytes=row.local_bytes, remote_log_start_offset=-1, remote_log_end_offset=-1, remote_bytes=0,
        remote_segments=0, manifest_version=-1, upload_lag_offsets=0, upload_lag_bytes=0, failures=0, last_error=None)
    assert row.local_bytes == sum(local_logs(broker.log_dir, PLAIN).values()) > 0

    result = run("-b", broker.bootstrap, "tier", "status", "no-such-topic")
    assert result.exit_code == 1
    assert "error: UNKNOWN_TOPIC_OR_PARTITION: unknown topic 'no-such-topic'" in result.stderr
    result = run("-b", broker.bootstrap, "tier", "status", PLAIN)
    assert result.exit_code == 0, result.output
    line = row_of(result.stdout, PLAIN, 0)
    assert line.split()[2:4] == ["[0,", "100)"] and line.rstrip().endswith("not tiered")


@pytest.mark.slow
def test_broken_store_shows_failures_and_the_error(broker_factory, tmp_path) -> None:
    """The store's root is a regular file: every tiering run fails; the status counts the
    failures in a row and names the error, the CLI says `failing: N x ...`, the metrics count them."""
    root = tmp_path / "remote-is-a-file"
    root.write_bytes(b"not a directory")
    broker = tiering_broker(broker_factory, f"file://{root}")
    create_topics(broker.bootstrap)
    produce(broker.bootstrap, TOPIC, 2_000)
    with Admin(broker.bootstrap) as admin:
        row = wait_until(lambda: next((r for r in admin.describe_tiering([TOPIC]) if r.failures >= 2), None), 30,
                         "tiering failed twice")
    assert row.tiered and row.last_error is not None
    assert "NotADirectoryError" in row.last_error and "RemoteStorageError" in row.last_error
    assert row.manifest_version == -1 and row.remote_log_end_offset == -1 and row.upload_lag_offsets == -1
    assert row.local_log_start_offset == 0 and row.log_end_offset == 2_000  # nothing local went

    result = run("-b", broker.bootstrap, "tier", "status", TOPIC)
    assert result.exit_code == 0, result.output
    status = re.search(r"failing: (\d+) x (.*)$", row_of(result.stdout, TOPIC, 0))
    assert status is not None, result.stdout
    assert int(status.group(1)) >= row.failures and "NotADirectoryError" in status.group(2)

    metrics = broker.metrics()
    assert metrics[f'pymq_tiering_failures_in_a_row{{partition="0",topic="{TOPIC}"}}'] >= 2
    assert metrics["pymq_tiering_failures_total"] >= 2
    assert f'pymq_remote_log_end_offset{{partition="0",topic="{TOPIC}"}}' not in metrics
