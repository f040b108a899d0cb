"""A table topic's Delta log, read without Spark: what the table is and how far it has synced.

`history()` plans every query from the table's log (its version, its properties, the newest sync
commit's offsets) before Spark reads a row. Asked through Spark (`DESCRIBE DETAIL`, `DESCRIBE
HISTORY`), those answers cost two Spark jobs, 0.3 s on a local session, which is a sixth of a
whole 10M-row aggregate over the table. The log is a public protocol (JSON commits, Parquet
checkpoints), so it is read here with delta-rs (`deltalake`), in milliseconds. The rows are read
by Spark at the version this read found: by Delta Lake, or, for a local table of few files, as
the Parquet files this read lists (`snapshot_files`, TableTopic.snapshot says when and why).

Locations are Spark's: a local path, `file://`, or an object store URL (`s3a://`, `s3://`, `gs://`,
`abfss://`). For `s3a://` the session's Hadoop settings (`fs.s3a.endpoint`, `fs.s3a.access.key`,
..., and their per-bucket forms `fs.s3a.bucket.NAME.*`) become delta-rs's storage options, so a
table is reached the same way by both readers; without keys, both use the AWS default chain.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

# Hadoop's s3a settings and the delta-rs (object_store) storage options they become.
_S3A_OPTIONS = {"endpoint": "AWS_ENDPOINT_URL", "access.key": "AWS_ACCESS_KEY_ID", "secret.key": "AWS_SECRET_ACCESS_KEY",
                "session.token": "AWS_SESSION_TOKEN", "endpoint.region": "AWS_REGION"}


OFFSETS_KEY = "pymq.offsets"  # in a sync commit's userMetadata: the offsets the table holds up to
# Commits read to find the newest sync commit: the sync makes most commits, so it is nearly always
# among the last few; only a long run of others (deletes, vacuums, optimizes) makes the whole log be read.
RECENT_COMMITS = 32

# Reader features that change nothing in how a data file is read (the log's format, vacuum, types
# the table's schema already names). Any other (deletionVectors, columnMapping, typeWidening, ...)
# needs Delta's own reader.
_PLAIN_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})


class TableTopicError(ValueError):
    """A table that is not the table topic asked for (none at its location, another topic, another
    value format, a store that cannot be read), or a value format that cannot be used."""


class NoTableError(TableTopicError):
    """There is no Delta table at the location."""


def s3a_storage_options(bucket: str, setting: Callable[[str], str | None]) -> dict[str, str]:
    """delta-rs storage options from Hadoop's s3a settings (`setting("fs.s3a.endpoint")`), the
    bucket's own (`fs.s3a.bucket.BUCKET.endpoint`) first, as s3a itself resolves them."""
    def get(key: str) -> str | None:
        return setting(f"fs.s3a.bucket.{bucket}.{key}") or setting(f"fs.s3a.{key}")

    options = {name: value for key, name in _S3A_OPTIONS.items() if (value := get(key))}
    endpoint = options.get("AWS_ENDPOINT_URL")
    if endpoint is not None:
        if "://" not in endpoint:  # s3a takes a bare host; its scheme follows connection.ssl.enabled
            ssl = (get("connection.ssl.enabled") or "true").lower() == "true"
            endpoint = options["AWS_ENDPOINT_URL"] = f"{'https' if ssl else 'http'}://{endpoint}"
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


@dataclass(frozen=True)
class SnapshotFiles:
    """A snapshot's data files and schema, as the log names them, and whether Spark's Parquet reader
    alone reads them as Delta's reader would (`needs_delta` says why not)."""

    version: int
    schema: dict[str, Any]  # Spark's StructType JSON (Delta's schema format is Spark's)
    paths: list[str]  # relative to the table's root, each under its partition's `column=value` folders
    needs_delta: str | None


@dataclass(frozen=True)
class TablePosition:
    """The latest commit of the sync job: the table version and the offsets it reached."""

    version: int
    offsets: dict[int, int]  # partition -> next offset not in the table


class TableLog:
    """The Delta log of the table at `uri` (a delta-rs URI: a local path or a store URL)."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self._table: DeltaTable | None = None  # loaded once, then brought up to date commit by commit

    @classmethod
    def of(cls, location: str, hadoop_setting: Callable[[str], str | None]) -> "TableLog":
        """The log of a table at a Spark location, reached with the Hadoop settings Spark uses."""
        url = urlparse(location)
        if url.scheme in ("s3a", "s3"):
            return cls(f"s3://{url.netloc}{url.path}", s3a_storage_options(url.netloc, hadoop_setting))
        return cls(location)

    def table(self) -> DeltaTable:
        """The table at its latest version. Only the log is read, and after the first call only
        the commits since the last (a sync asks after every batch; history() twice per call)."""
        try:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options or None)
            else:
                self._table.update_incremental()
            return self._table
        except TableNotFoundError:
            raise NoTableError(f"{self.uri} is not a Delta table (has `pymq table sync` run?)") from None
        except (DeltaError, OSError) as err:
            raise TableTopicError(f"cannot read the Delta log at {self.uri}: {err}") from None

    def position(self) -> TablePosition:
        """The table's latest version and the offsets of the newest sync commit at or below it
        (offsets {} when nothing was synced yet)."""
        commits = self.commits(RECENT_COMMITS)
        if not any(OFFSETS_KEY in (c.get("userMetadata") or "") for c in commits) and min(c["version"] for c in commits) > 0:
            commits = self.commits(None)  # a long run of other commits
        marked = [c for c in commits if OFFSETS_KEY in (c.get("userMetadata") or "")]
        newest = max(marked, key=lambda c: c["version"]) if marked else None
        offsets = json.loads(newest["userMetadata"])[OFFSETS_KEY] if newest else {}
        return TablePosition(max(c["version"] for c in commits), {int(p): int(o) for p, o in offsets.items()})

    def at(self, version: int) -> DeltaTable:
        """The table at `version`: the loaded one when it is there (history() reads the position,
        then the snapshot at it, and a sync committing meanwhile must not move the snapshot)."""
        table = self.table() if self._table is None else self._table
        if table.version() == version:
            return table
        try:
            return DeltaTable(self.uri, version=version, storage_options=self.storage_options or None)
        except (DeltaError, OSError) as err:
            raise TableTopicError(f"cannot read version {version} of the Delta table at {self.uri}: {err}") from None

    def snapshot_files(self, version: int, max_files: int | None) -> SnapshotFiles:
        """The data files of `version`, unless they are more than `max_files`. Spark's Parquet
        reader reads them as Delta's does when the table uses no reader feature that changes a
        file's meaning (deletion vectors, column mapping) and each file lies in the folders of
        its partition values, where Spark's partition discovery finds them."""
        table = self.at(version)
        schema = json.loads(table.schema().to_json())
        protocol = table.protocol()
        features = set(protocol.reader_features or ())
        mapping = table.metadata().configuration.get("delta.columnMapping.mode") or "none"
        if protocol.min_reader_version == 2 or mapping != "none":
            return SnapshotFiles(version, schema, [], f"column mapping ({mapping})")
        if features - _PLAIN_READER_FEATURES:
            return SnapshotFiles(version, schema, [], f"reader features {sorted(features - _PLAIN_READER_FEATURES)}")
        if urlparse(self.uri).scheme not in ("", "file"):
            return SnapshotFiles(version, schema, [], "an object store: the log's sizes and statistics spare a "
                                                      "request per file")
        actions = pa.table(table.get_add_actions(flatten=False))
        if max_files is not None and actions.num_rows > max_files:
            return SnapshotFiles(version, schema, [], f"{actions.num_rows} files: Delta's statistics skip files "
                                                      "without opening them")
        partitions = table.metadata().partition_columns
        paths = actions.column("path").to_pylist()
        values = actions.column("partition").to_pylist() if partitions else [{}] * len(paths)
        for path, partition in zip(paths, values):
            folders = "/".join(f"{column}={partition[column]}" for column in partitions)
            if "%" in path or ":" in path or path.rpartition("/")[0] != folders:
                return SnapshotFiles(version, schema, [], f"the file {path} lies outside its partition's folder")
        return SnapshotFiles(version, schema, paths, None)

    def exists(self) -> bool:
        try:
            self.table()
        except NoTableError:
            return False
        return True

    def properties(self) -> dict[str, str]:
        return {k: v for k, v in self.table().metadata().configuration.items() if v is not None}

    def commits(self, limit: int | None) -> list[dict[str, Any]]:
        """The newest `limit` commits' infos (all the log still holds with None), newest first;
        each has its `version` and, when the writer set one, `userMetadata`."""
        table = self.table()
        try:
            return table.history(limit)
        except (DeltaError, OSError) as err:
            raise TableTopicError(f"cannot read the Delta log at {self.uri}: {err}") from None
