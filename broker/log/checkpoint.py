"""Checkpoint files: small text files replaced atomically.

    {log_dir}/recovery-point-offset-checkpoint   per partition: every offset below it is fsynced,
                                                 so recovery re-validates only what follows
    {log_dir}/log-start-offset-checkpoint        per partition: the first offset consumers may read
    {log_dir}/replication-offset-checkpoint      per partition: the high watermark
    {topic}-{partition}/leader-epoch-checkpoint  "<epoch> <start_offset>" lines (leader_epoch.py)
    {topic}-{partition}/partition.metadata       the topic id the directory belongs to

A checkpoint is written to `<name>.tmp`, fsynced, renamed over the old file, and the directory is
fsynced: a reader sees the old content or the new, never a torn mix. Stray `.tmp` files from a
crash mid-write are garbage (the log loader removes them on open). Writing one costs three
fsyncs: call these from a worker thread, never from the event loop.
"""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from common.errors import KafkaStorageError

log = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and deletions of entries in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_and_close(fds: list[int], what: Path) -> None:
    """fsync then close `fds`, duplicates owned by the caller (see Segment.prepare_sync); every
    fd is closed even if a sync fails. KafkaStorageError names `what` on failure."""
    try:
        for fd in fds:
            os.fsync(fd)
    except OSError as err:
        raise KafkaStorageError(f"cannot fsync {what}: {err}") from err
    finally:
        for fd in fds:
            os.close(fd)


def write_atomically(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace `path` with `text` so that a crash leaves either the old or the new content.

    `durable=False` is for the files of a log being created, made durable all at once with
    `sync_filesystem` (topic creation): written in place, without fsyncs or a temporary file
    (a third of the cost of creating a partition). A crash before the sync can tear them, and
    their readers take a torn file as a missing one, which the next start writes again."""
    if not durable:
        try:
            path.write_text(text, encoding="ascii")
        except OSError as err:
            raise KafkaStorageError(f"cannot write {path}: {err}") from err
        return
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as err:
        raise KafkaStorageError(f"cannot write {path}: {err}") from err


def sync_filesystem(directory: Path) -> None:
    """Make everything written under `directory`'s filesystem durable with one syncfs(2): cheaper
    than an fsync per file when thousands of partition directories were just created."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        if _libc is None:
            os.sync()
        elif _libc.syncfs(fd) != 0:  # a writeback error (EIO, ENOSPC): the data is not durable, say so
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
    except OSError as err:
        raise KafkaStorageError(f"cannot sync {directory}: {err}") from err
    finally:
        os.close(fd)


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "syncfs") else None
    except OSError:
        return None


_libc = _load_libc()


# --- log directory checkpoints (Kafka's OffsetCheckpointFile) ------------------------------------
#
#   recovery-point-offset-checkpoint, log-start-offset-checkpoint, replication-offset-checkpoint:
#       0                        format version
#       <count>
#       <topic> <partition> <offset>    one line per partition of the log directory
#
# One file per kind for every partition of a directory, so checkpointing 10,000 partitions is one
# atomic write, not 10,000.

OFFSETS_VERSION = 0


def write_offsets(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    lines = [f"{OFFSETS_VERSION}\n", f"{len(offsets)}\n"]
    lines.extend(f"{topic} {partition} {offset}\n" for (topic, partition), offset in sorted(offsets.items()))
    write_atomically(path, "".join(lines))


def read_offsets(path: Path) -> dict[tuple[str, int], int]:
    """The offsets of an offsets checkpoint; empty if it is missing. A malformed file is logged and
    read as empty: every offset it held is a lower bound that 0 also satisfies (recovery then
    re-validates more, and nothing is trusted that should not be)."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        log.warning("%s is unreadable (%s): ignoring it", path, err)
        return {}
    try:
        if int(lines[0]) != OFFSETS_VERSION or int(lines[1]) != len(lines) - 2:
            raise ValueError(f"version {lines[0]!r} / count {lines[1]!r} do not match")
        offsets = {}
        for line in lines[2:]:
            topic, partition, offset = line.split()
            offsets[(topic, int(partition))] = int(offset)
        return offsets
    except (ValueError, IndexError) as err:
        log.warning("%s is malformed (%s): ignoring it", path, err)
        return {}


# --- partition.metadata (Kafka's PartitionMetadataFile) -------------------------------------------
#
#   version: 0
#   topic_id: <32 hex digits>
#
# Ties a partition directory to one incarnation of its topic: a topic deleted and re-created under
# the same name (say, after a crash between the metadata delete and the log delete) gets a new id,
# and the old directory is then recognised as stale instead of being adopted with its records.

PARTITION_METADATA_FILE = "partition.metadata"


def write_partition_metadata(directory: Path, topic_id: str, *, durable: bool = True) -> None:
    write_atomically(directory / PARTITION_METADATA_FILE, f"version: 0\ntopic_id: {topic_id}\n", durable=durable)


def read_partition_metadata(directory: Path) -> str | None:
    """The topic id a partition directory belongs to, or None if it has no (well-formed) file."""
    try:
        text = (directory / PARTITION_METADATA_FILE).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        text = ""  # torn into binary garbage: malformed, below
    except OSError as err:
        raise KafkaStorageError(f"cannot read {directory / PARTITION_METADATA_FILE}: {err}") from err
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    if fields.get("version") != "0" or not fields.get("topic_id"):
        # Written without an fsync at topic creation: a crash can leave it torn. The directory
        # was being created for the topic the caller names, so it is adopted.
        log.warning("%s is malformed: adopting the directory", directory / PARTITION_METADATA_FILE)
        return None
    return fields["topic_id"]
