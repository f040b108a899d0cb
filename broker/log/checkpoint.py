"""Checkpoint files of a partition directory: small text files replaced atomically.

    recovery-point.checkpoint   "<offset>\\n": every offset below it is fsynced, so recovery on
                                open re-validates only the segments from the one holding it on
    leader-epoch.checkpoint     "<epoch> <start_offset>\\n" per line (leader_epoch.py)

A checkpoint is written to `<name>.tmp`, fsynced, renamed over the old file, and the directory is
fsynced: a reader sees the old content or the new, never a torn mix. Stray `.tmp` files from a
crash mid-write are garbage (PartitionLog removes them on open).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from broker.errors import KafkaStorageError

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


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a crash leaves either the old or the new content."""
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


def read_recovery_point(path: Path) -> int:
    """The stored recovery point, or 0 (re-validate everything) if missing or unreadable."""
    try:
        return int(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s): recovering the whole log", path, err)
        return 0


def write_recovery_point(path: Path, offset: int) -> None:
    write_atomically(path, f"{offset}\n")
