"""The table log reader: Hadoop's s3a settings as delta-rs storage options, locations with no
table or an unreachable store, a log read again after new commits. (Reading real logs written by
Spark's Delta Lake, on a path and on s3a:// in moto, is covered by tests/jobs/test_table_topic.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from jobs.table_log import TableLog, TableTopicError, s3a_storage_options


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
    import pyarrow as pa
    from deltalake import write_deltalake

    rows = pa.table({"offset": pa.array([0, 1], pa.int64())})
    write_deltalake(str(tmp_path), rows)
    log = TableLog(str(tmp_path))
    assert log.table().version() == 0
    write_deltalake(str(tmp_path), rows, mode="append")
    assert log.table().version() == 1
    assert [c["version"] for c in log.commits(None)] == [1, 0]
