"""The versioned header both index kinds share (IndexFile): any corruption of it is detected."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segment_format.index_file import HEADER_SIZE, CorruptIndexError, IndexFile
from segment_format.offset_index import OffsetIndex
from segment_format.time_index import TimeIndex

BASE = 100


@pytest.mark.parametrize("kind, entry, suffix", [(OffsetIndex, struct.pack("<ii", 10, 1000), ".index"),
                                                 (TimeIndex, struct.pack("<qi", 100, 5), ".timeindex")],
                         ids=["offset-index", "time-index"])
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_header_corruption_is_detected(kind: type[IndexFile], entry: bytes, suffix: str, data):
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
