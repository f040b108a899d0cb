"""The table log reader: Hadoop's s3a settings as delta-rs storage options, locations with no
table or an unreachable store, a log read again after new commits. (Reading real logs written by
Spark's Delta Lake, on a path and on s3a:// in moto, is covered by tests/jobs/test_table_topic.py.)"""
from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spark_datasource.table_log import TableLog, TableTopicError, s3a_storage_options


def test_s3a_settings_become_storage_options_the_buckets_own_first() -> None:
    settings = {"fs.s3a.endpoint": "https://s3.example.com", "fs.s3a.access.key": "global-key",
                "fs.s3a.secret.key": "global-secret", "fs.s3a.bucket.data.access.key": "data-key",
                "fs.s3a.bucket.data.endpoint.region": "eu-west-1"}
    assert s3a_storage_options("data", settings.get) == {
        "AWS_ENDPOINT_URL": "https://s3.example.com", "AWS_ACCESS_KEY_ID": "data-key",
        "AWS_SECRET_ACCESS_KEY": "global-secret", "AWS_REGION": "eu-west-1"}
    assert s3a_storage_options("other", settings.get)["AWS_ACCESS_KEY_ID"] == "global-key"


def test_a_bare_s3a_endpoint_takes_its_scheme_from_the_ssl_setting() -> None:
    plain = {"fs.s3a.endpoint": "127.0.0.1:9000", "fs.s3a.connection.ssl.enabled": "false"}
    assert s3a_storage_options("b", plain.get) == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
    assert s3a_storage_options("b", {"fs.s3a.endpoint": "minio:9000"}.get) == {"AWS_ENDPOINT_URL": "https://minio:9000"}
    assert s3a_storage_options("b", {}.get) == {}  # AWS itself, credentials from the default chain


def test_locations_map_to_delta_rs_uris() -> None:
    settings = {"fs.s3a.bucket.lake.endpoint": "http://127.0.0.1:5000"}
    log = TableLog.of("s3a://lake/tables/clicks", settings.get)
    assert (log.uri, log.storage_options) == ("s3://lake/tables/clicks",
                                              {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "AWS_ALLOW_HTTP": "true"})
    assert TableLog.of("/data/clicks", settings.get).uri == "/data/clicks"


def test_a_location_with_no_table_is_a_named_error(tmp_path: Path) -> None:
    log = TableLog(str(tmp_path / "nothing-here"))
    assert not log.exists()
    with pytest.raises(TableTopicError, match="is not a Delta table"):
        log.properties()
    with pytest.raises(TableTopicError, match="is not a Delta table"):
        log.commits(1)


def test_a_store_that_cannot_be_read_is_a_named_error_not_a_missing_table() -> None:
    """An S3 endpoint nothing listens on: exists() does not answer False (which would make a sync
    try to create the table), it names the store's failure."""
    log = TableLog("s3://lake/t", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true",
                                   "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                                   "AWS_MAX_RETRIES": "0", "AWS_RETRY_TIMEOUT": "1s"})
    with pytest.raises(TableTopicError, match="cannot read the Delta log at s3://lake/t"):
        log.exists()


def test_a_log_read_again_sees_the_commits_made_since(tmp_path: Path) -> None:
    """The log is loaded once and then brought up to date: a second read sees a newer commit."""
    rows = pa.table({"offset": pa.array([0, 1], pa.int64())})
    write_deltalake(str(tmp_path), rows)
    log = TableLog(str(tmp_path))
    assert log.table().version() == 0
    write_deltalake(str(tmp_path), rows, mode="append")
    assert log.table().version() == 1
    assert [c["version"] for c in log.commits(None)] == [1, 0]


def dated(days: list[int]) -> pa.Table:
    return pa.table({"offset": pa.array(range(len(days)), pa.int64()),
                     "date": pa.array([datetime.date(2026, 11, d) for d in days], pa.date32())})


def test_a_snapshots_files_lie_in_their_partition_folders(tmp_path: Path) -> None:
    """The files of each version, as the log lists them, readable by Spark's Parquet reader with
    partition discovery; too many files leave the snapshot to Delta's reader."""
    write_deltalake(str(tmp_path), dated([1, 2]), partition_by=["date"])
    write_deltalake(str(tmp_path), dated([2, 3]), partition_by=["date"], mode="append")
    log = TableLog(str(tmp_path))
    latest = log.snapshot_files(1, max_files=4)
    assert latest.needs_delta is None and latest.version == 1
    assert sorted(path.partition("/")[0] for path in latest.paths) == ["date=2026-11-01", "date=2026-11-02",
                                                                     "date=2026-11-02", "date=2026-11-03"]
    assert all((tmp_path / path).is_file() for path in latest.paths)
    assert [f["name"] for f in latest.schema["fields"]] == ["offset", "date"]
    assert len(log.snapshot_files(0, max_files=None).paths) == 2  # an older version: its own files
    assert log.snapshot_files(1, max_files=3).needs_delta == "4 files: Delta's statistics skip files without opening them"


def test_tables_whose_files_mean_more_than_their_parquet_need_delta(tmp_path: Path) -> None:
    """Deletion vectors (rows deleted without rewriting a file) and column mapping (physical
    column names): Spark's Parquet reader alone would read other rows or other columns."""
    write_deltalake(str(tmp_path / "dv"), dated([1]), configuration={"delta.enableDeletionVectors": "true"})
    assert "deletionVectors" in TableLog(str(tmp_path / "dv")).snapshot_files(0, None).needs_delta
    write_deltalake(str(tmp_path / "cm"), dated([1]), configuration={"delta.columnMapping.mode": "name"})
    assert TableLog(str(tmp_path / "cm")).snapshot_files(0, None).needs_delta == "column mapping (name)"
