"""The versioned header both index kinds share (IndexKind): any corruption of it is detected."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format.index_file import (
    HEADER_SIZE,
    OFFSET_INDEX,
    TIME_INDEX,
    CorruptIndexError,
    IndexKind,
    IndexOrderError,
    SparseIndex,
)

BASE = 100


@pytest.mark.parametrize("kind, entry, suffix", [(OFFSET_INDEX, struct.pack("<ii", 10, 1000), ".index"),
                                                 (TIME_INDEX, struct.pack("<qi", 100, 5), ".timeindex")],
                         ids=["offset-index", "time-index"])
@settings(max_examples=200)
@given(data=st.data())
def test_any_header_corruption_is_detected(kind: IndexKind, entry: bytes, suffix: str, data):
    """Flipping any bits of any header byte, or cutting the header short, makes parsing fail."""
    good = kind.header(BASE) + entry
    if data.draw(st.booleans(), label="truncate"):
        corrupt = good[: data.draw(st.integers(0, HEADER_SIZE - 1), label="length")]
    else:
        at = data.draw(st.integers(0, HEADER_SIZE - 1), label="byte")
        flip = data.draw(st.integers(1, 255), label="xor")
        corrupt = good[:at] + bytes([good[at] ^ flip]) + good[at + 1 :]
    with pytest.raises(CorruptIndexError):
        kind.parse(corrupt, Path(f"{BASE:020d}{suffix}"), BASE)


@pytest.mark.parametrize("kind, entries, backwards", [
    (OFFSET_INDEX, [(110, 0), (120, 500)], (115, 600)),  # an offset that goes back
    (TIME_INDEX, [(1_000, 110), (2_000, 120)], (3_000, 115)),  # an offset that goes back
], ids=["offset-index", "time-index"])
def test_both_kinds_name_an_entry_out_of_order(tmp_path, kind: IndexKind, entries, backwards):
    """One class, two kinds: an entry out of the kind's order is an IndexOrderError (a
    CorruptIndexError) whichever kind, in append and in a loaded file's sanity check, and the
    file written is the header and the packed entries, byte for byte."""
    index = SparseIndex(kind, tmp_path / "x", BASE)
    for key, value in entries:
        index.append(key, value)
    with pytest.raises(IndexOrderError):
        index.append(*backwards)
    relative = [(k - BASE, v) if kind is OFFSET_INDEX else (k, v - BASE) for k, v in entries]
    image = kind.header(BASE) + b"".join(kind.entry.pack(*entry) for entry in relative)
    assert index.image() == image
    swapped = kind.header(BASE) + b"".join(kind.entry.pack(*entry) for entry in reversed(relative))
    with pytest.raises(IndexOrderError):
        kind.parse(swapped, Path("x"), BASE).sanity_check(10**6)
