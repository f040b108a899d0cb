"""The cleaner's segment swap (LocalLog.replace_segments) and its crash recovery (LogLoader): a
crash after any number of the swap's renames, simulated by stopping at that rename and reopening
the directory as SIGKILL would leave it, loses no record, duplicates no offset, keeps the log's
start and end, and leaves no `.cleaned`, `.swap` or `.deleted` file behind."""
from __future__ import annotations

import errno
import os

import pytest

from segment_format import record
from common.errors import KafkaStorageError
from broker.log import LogCleaner, Segment, UnifiedLog
from segment_format.layout import CLEANED_SUFFIX
from tests.helpers.log_cleaning import GROUP, NOW_MS, Entry, build, latest, read_all, write_cleaned

RENAMES = 3 + 3 * GROUP + 3


class Crash(BaseException):
    """SIGKILL at a rename: nothing after it runs, no cleanup, no except clause catches it."""


def records_of(segment: Segment) -> list[Entry]:
    out: list[Entry] = []
    with segment.detached_reader() as reader:
        for header, body in reader.read_arrow(segment.base_offset):
            out += zip(record.record_offsets(header, body).to_pylist(), body.column("key").to_pylist(),
                       body.column("value").to_pylist())
    return out


def crash_at_rename(monkeypatch, k: int) -> None:
    """Let `k` renames happen; the next one crashes."""
    real_rename = os.rename
    done = 0

    def rename(src, dst) -> None:  # type: ignore[no-untyped-def]
        nonlocal done
        if done == k:
            raise Crash(f"crash before rename {k}: {src} -> {dst}")
        real_rename(src, dst)
        done += 1

    monkeypatch.setattr(os, "rename", rename)


def leftovers(partition_log: UnifiedLog) -> list[str]:
    return sorted(p.name for p in partition_log.directory.iterdir() if p.suffix in (".cleaned", ".swap", ".deleted"))


@pytest.mark.parametrize("scenario", ["survivors", "emptied"])
def test_a_swap_replaces_the_group_at_once(open_log, logs, scenario):
    """Without a crash: the cleaned segment takes the group's place in the log and in the
    directory, the old files wait as `.deleted` for the delayed delete."""
    partition_log, _ = build(open_log, scenario)
    original = read_all(partition_log)
    cleaned, group = write_cleaned(partition_log, logs.manager.cache)
    survivors = records_of(cleaned)
    generation = partition_log.cleanable_segments().generation
    assert partition_log.replace_segments(cleaned, group, generation)
    assert partition_log.segments()[0] is cleaned and not set(group) & set(partition_log.segments())
    assert cleaned.log_path.name == f"{0:020d}.log"
    assert all(segment.log_path.name.endswith(".log.deleted") for segment in group)
    group_end = group[-1].next_offset
    assert read_all(partition_log) == survivors + [e for e in original if e[0] >= group_end]
    assert len(survivors) < len([e for e in original if e[0] < group_end])
    assert not partition_log.replace_segments(cleaned, group, generation)  # the group is gone now


@pytest.mark.parametrize("scenario", ["survivors", "emptied"])
@pytest.mark.parametrize("k", range(RENAMES + 1), ids=lambda k: f"after_{k}_renames")
def test_a_crash_at_any_rename_of_a_swap_recovers_the_log(open_log, logs, monkeypatch, scenario, k):
    """Crash after k renames, reopen: before the commit (the `.swap` `.log`, rename 3) the log is
    as it was; after it, cleaned. A segment of the group that cleaning emptied and whose `.log`
    was not renamed yet stays with its superseded records (no offset twice, nothing lost), and the
    next cleaning round, whose checkpoint never moved, removes them."""
    partition_log, written = build(open_log, scenario)
    original = read_all(partition_log)
    start, end = partition_log.log_start_offset, partition_log.log_end_offset
    cleaned, group = write_cleaned(partition_log, logs.manager.cache)
    survivors, cleaned_end = records_of(cleaned), cleaned.next_offset
    assert (cleaned_end <= group[1].base_offset) == (scenario == "emptied")  # the members after it: emptied
    generation = partition_log.cleanable_segments().generation
    crash_at_rename(monkeypatch, k)
    if k < RENAMES:
        with pytest.raises(Crash):
            partition_log.replace_segments(cleaned, group, generation)
    else:
        assert partition_log.replace_segments(cleaned, group, generation)
    monkeypatch.undo()
    logs.crash()

    reopened = logs.open(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    recovered = read_all(reopened)
    assert leftovers(reopened) == []
    assert (reopened.log_start_offset, reopened.log_end_offset) == (start, end)
    offsets = [offset for offset, _, _ in recovered]
    assert offsets == sorted(set(offsets))
    group_end = group[-1].next_offset
    if k < 3:
        assert recovered == original
    else:
        # A member emptied by cleaning (based at or past where the cleaned segment ends) whose
        # `.log` kept its name: rename 3 + 3i + 3 retires member i.
        stale = [e for i, segment in enumerate(group)
                 if segment.base_offset >= max(cleaned_end, group[0].base_offset + 1) and k < 3 + 3 * i + 3
                 for e in original if segment.base_offset <= e[0] < segment.next_offset]
        assert recovered == survivors + stale + [e for e in original if e[0] >= group_end]
    # Whatever the crash left, a cleaning round (the checkpoint never moved) gets to the clean log.
    reopened.update_high_watermark(end)  # the partition's part after a restart
    assert LogCleaner(logs.manager, clock=lambda: NOW_MS).clean_once(NOW_MS) is not None
    active_base = reopened.segments()[-1].base_offset
    assert [e for e in read_all(reopened) if e[0] < active_base] == latest([e for e in written if e[0] < active_base])


def test_a_failed_rename_before_the_commit_changes_nothing(open_log, logs, monkeypatch):
    """An I/O error renaming the cleaned files `.swap` leaves the log as it was and raises; the
    caller still owns the cleaned segment."""
    partition_log, _ = build(open_log, "survivors")
    before = (read_all(partition_log), partition_log.segments())
    cleaned, group = write_cleaned(partition_log, logs.manager.cache)
    fail_rename(monkeypatch, when=lambda src: str(src).endswith(".log.cleaned"))
    with pytest.raises(KafkaStorageError):
        partition_log.replace_segments(cleaned, group, partition_log.cleanable_segments().generation)
    monkeypatch.undo()
    assert (read_all(partition_log), partition_log.segments()) == before and not partition_log.offline
    assert cleaned.files.state == CLEANED_SUFFIX


def test_a_failed_rename_after_the_commit_takes_the_directory_offline_until_a_restart(open_log, logs, monkeypatch):
    """An I/O error retiring an old segment after the commit: the directory goes offline (only the
    loader can finish the swap), and the restart finishes it."""
    partition_log, written = build(open_log, "survivors")
    cleaned, group = write_cleaned(partition_log, logs.manager.cache)
    fail_rename(monkeypatch, when=lambda src: str(src).endswith(f"{6:020d}.log"))
    with pytest.raises(KafkaStorageError):
        partition_log.replace_segments(cleaned, group, partition_log.cleanable_segments().generation)
    monkeypatch.undo()
    assert partition_log.offline
    with pytest.raises(KafkaStorageError):
        partition_log.read(0, 1024)
    logs.crash()
    reopened = logs.open(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0)
    assert leftovers(reopened) == [] and not reopened.offline
    assert [e for e in read_all(reopened) if e[0] < 18] == latest([e for e in written if e[0] < 18])


def fail_rename(monkeypatch, when) -> None:  # type: ignore[no-untyped-def]
    real_rename = os.rename

    def rename(src, dst) -> None:  # type: ignore[no-untyped-def]
        if when(src):
            raise OSError(errno.EIO, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
