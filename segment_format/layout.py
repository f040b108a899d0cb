"""The layout of a partition's files, on local disk and in object storage (docs/architecture.md,
"On-disk layout"): topic names, the segment file names and the states a segment's files pass through.

    {topic}-{partition}/          a partition's directory (local); {topic}/{partition}/ remotely
    {base_offset:020d}.log        concatenated record batches (record.py)
    {base_offset:020d}.index      sparse offset index (index_file.py, OFFSET_INDEX)
    {base_offset:020d}.timeindex  sparse time index (index_file.py, TIME_INDEX)
    {base_offset:020d}.txnindex   aborted transactions whose ABORT marker is in the segment
                                  (txn_index.py); only in segments that hold one

20-digit base offsets make `ls` sort by offset (Kafka's LogFileUtils). Topic names follow
Kafka's rules, which also keep every name a safe single path component.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import InvalidTopicError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    """Path of one of a segment's files; 20-digit names make `ls` sort by offset."""
    return directory / f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """The files that make up one segment, as data: what retention renames, what deletion unlinks,
    what tiering uploads. A kind added later (a producer `.snapshot`, a `.txnindex`) is one more
    entry in `KINDS`, and every operation over the set picks it up.

    `state` is "" for a live segment, `.deleted` once removed from its log, `.cleaned` while the
    log cleaner writes it and `.swap` while it replaces the segments it was cleaned from."""

    directory: Path
    base_offset: int
    state: str = ""

    # Built once per kind: every append and fetch names the `.log` (a file cache key), and a
    # fresh Path costs its parsing and hashing each time.
    _paths: dict[str, Path] = field(default_factory=dict, init=False, repr=False, compare=False)

    KINDS: tuple[str, ...] = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

    def path(self, kind: str) -> Path:
        found = self._paths.get(kind)
        if found is None:
            found = self._paths[kind] = self.directory / f"{self.base_offset:020d}{kind}{self.state}"
        return found

    @property
    def log(self) -> Path:
        return self.path(LOG_SUFFIX)

    @property
    def index(self) -> Path:
        return self.path(INDEX_SUFFIX)

    @property
    def time_index(self) -> Path:
        return self.path(TIME_INDEX_SUFFIX)

    @property
    def txn_index(self) -> Path:
        return self.path(TXN_INDEX_SUFFIX)

    def paths(self) -> list[Path]:
        return [self.path(kind) for kind in self.KINDS]

    def in_state(self, state: str) -> SegmentFiles:
        return SegmentFiles(self.directory, self.base_offset, state)


TOPIC_NAME_MAX = 249
_LEGAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def validate_topic_name(name: Any) -> str:
    """Kafka's rules: 1..249 chars of [a-zA-Z0-9._-], not '.' or '..'. Raises InvalidTopicError."""
    if not isinstance(name, str) or not name or len(name) > TOPIC_NAME_MAX:
        raise InvalidTopicError(f"topic name must be 1..{TOPIC_NAME_MAX} characters")
    if name in (".", "..") or not set(name) <= _LEGAL:
        raise InvalidTopicError(f"illegal topic name {name!r}: use letters, digits, '.', '_' and '-'")
    return name

