"""The table log reader's pure parts: Hadoop's s3a settings as delta-rs storage options, and
locations with no table. (Reading real logs written by Spark's Delta Lake, on a path and on s3a://,
is covered by tests/jobs/test_table_topic.py.)"""
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
