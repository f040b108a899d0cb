"""TxnIndexFile: one segment's aborted transaction index kept in its file (segment_format/txn_index.py
has the format; Kafka's TxnIndex).

Most segments never hold an ABORT marker: the file exists only once an entry was appended, and
its entries are read lazily on first use (a log open stats no `.txnindex` per segment). Entries
are appended as markers are written (one small write each, rare), cut by truncation, and made
durable with the segment (`prepare_sync`). Called under the log's append lock for changes; reads
of `entries` return the list as it is (append-only between truncations).
"""
from __future__ import annotations

import os
from pathlib import Path

from common.errors import KafkaStorageError
from segment_format import txn_index
from segment_format.index_file import CorruptIndexError
from segment_format.txn_index import AbortedTxn


class TxnIndexFile:
    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] | None = None  # None: not read yet

    @property
    def entries(self) -> list[AbortedTxn]:
        """The entries, read from the file on first use (none if it does not exist). A corrupt
        file raises CorruptIndexError (recovery rebuilds it from the log's markers)."""
        if self._entries is None:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = None
            except OSError as err:
                raise KafkaStorageError(f"cannot read {self.path}: {err}") from err
            self._entries = [] if data is None else txn_index.parse(data, str(self.path), self.base_offset)
        return self._entries

    def mark_absent(self) -> None:
        """The caller knows the file does not exist (a new segment; a listing without it): no
        read is ever tried (a fetch's collect runs on the event loop)."""
        self._entries = []

    def append(self, txn: AbortedTxn) -> None:
        """Append an entry (its marker was just written to this segment)."""
        entries = self._entries_or_reset()
        if entries and txn.last_offset <= entries[-1].last_offset:
            raise KafkaStorageError(f"{self.path}: entry {txn} does not follow {entries[-1]}")
        data = txn_index.encode_entry(txn)
        if not entries:
            data = txn_index.encode_header(self.base_offset) + data
        try:
            with open(self.path, "ab" if entries else "wb") as file:
                file.write(data)
        except OSError as err:
            raise KafkaStorageError(f"cannot write {self.path}: {err}") from err
        entries.append(txn)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or past `offset` (the log was cut there)."""
        entries = self._entries_or_reset()
        kept = [txn for txn in entries if txn.last_offset < offset]
        if len(kept) == len(entries):
            return
        self._rewrite(kept)

    def _entries_or_reset(self) -> list[AbortedTxn]:
        """The entries; a corrupt file is dropped (recovery replays the markers into it again)."""
        try:
            return self.entries
        except CorruptIndexError:
            self._rewrite([])
            return self.entries

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        try:
            if entries:
                with open(self.path, "r+b") as file:
                    file.truncate(txn_index.HEADER_SIZE + len(entries) * txn_index.ENTRY_SIZE)
            else:
                self.path.unlink(missing_ok=True)
        except OSError as err:
            raise KafkaStorageError(f"cannot truncate {self.path}: {err}") from err
        self._entries = entries

    def reset(self) -> None:
        """No entries (recovery replays this segment's markers from its start)."""
        self._rewrite([])

    def image(self) -> bytes | None:
        """The file's bytes, or None when the segment has no aborted transaction."""
        entries = self.entries
        return txn_index.encode(self.base_offset, entries) if entries else None

    def prepare_sync(self) -> int | None:
        """A new fd (owned by the caller) whose fsync makes the entries durable, or None."""
        if not self._entries and not (self._entries is None and self.path.exists()):
            return None
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise KafkaStorageError(f"cannot open {self.path}: {err}") from err

    def rename(self, path: Path) -> None:
        """Move the file (if any) to `path`. KafkaStorageError if the rename fails."""
        try:
            os.rename(self.path, path)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise KafkaStorageError(f"cannot rename {self.path}: {err}") from err
        self.path = path
