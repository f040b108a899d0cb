"""LogDirSpace: a full log directory is logged once per change of state, with its free bytes."""
from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from common.errors import KafkaStorageError
from broker.log.log_dir_space import LogDirSpace, is_no_space


def _storage_error(code: int) -> KafkaStorageError:
    try:
        try:
            raise OSError(code, "injected")
        except OSError as err:
            raise KafkaStorageError(f"cannot write x.log: {err}") from err
    except KafkaStorageError as err:
        return err


@pytest.mark.parametrize("code, no_space", [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EIO, False)],
                         ids=["ENOSPC", "EDQUOT", "EIO"])
def test_only_lack_of_space_counts(code: int, no_space: bool) -> None:
    assert is_no_space(_storage_error(code)) is no_space


def test_each_change_of_state_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Refused appends after the first log nothing more; an I/O error that is not lack of space
    changes nothing; the first append written again logs the recovery, once."""
    space = LogDirSpace(tmp_path)
    caplog.set_level(logging.INFO, logger="broker.log.log_dir_space")
    space.write_succeeded()
    space.write_failed(_storage_error(errno.EIO))
    assert not space.full and not caplog.records
    for _ in range(3):
        space.write_failed(_storage_error(errno.ENOSPC))
    assert space.full
    (full,) = caplog.records
    assert full.levelno == logging.ERROR and f"log directory {tmp_path} is full (" in full.getMessage()
    assert "bytes free" in full.getMessage()
    for _ in range(3):
        space.write_succeeded()
    assert not space.full
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"log directory {tmp_path} is full", f"log directory {tmp_path} has space again"]
