"""ReadAhead: sequential reads come from the window fetched in the background; any read returns
exactly the object's bytes; a background fetch's error is raised by the read that needs it."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CorruptMessageError
from tiered_storage.read_ahead import ReadAhead

DATA = bytes(range(256)) * 40  # 10,240 bytes


class Store:
    """Fetches from DATA, recording (position, size, thread name) of each fetch."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fetched: list[tuple[int, int, str]] = []
        self.fail_at = fail_at

    def __call__(self, position: int, size: int) -> bytes:
        self.fetched.append((position, size, threading.current_thread().name))
        if self.fail_at is not None and position <= self.fail_at < position + size:
            raise CorruptMessageError(f"object ends at byte {self.fail_at}")
        return DATA[position:position + size]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1, thread_name_prefix="ahead") as pool:
        yield pool


def test_a_sequential_scan_waits_only_for_its_first_window(executor):
    store = Store()
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    got = b"".join(ahead(min(1024, len(DATA) - at), at) for at in range(0, len(DATA), 1024))
    assert got == DATA
    assert [(p, s) for p, s, _ in store.fetched] == [(at, 1024) for at in range(0, len(DATA), 1024)]
    direct = [p for p, _, thread in store.fetched if not thread.startswith("ahead")]
    assert direct == [0]  # every later window was fetched ahead, on the executor
    assert ahead.fetches == len(DATA) // 1024


def test_a_primed_window_is_taken_by_the_first_read(executor):
    store = Store()
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    ahead.prime(2048)
    assert ahead(1024, 2048) == DATA[2048:3072]
    assert all(thread.startswith("ahead") for *_, thread in store.fetched)


def test_a_read_larger_than_the_window_gets_the_rest_directly(executor):
    """A batch larger than the window: the window ahead plus a direct read of the remainder."""
    store = Store()
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    assert ahead(1024, 0) == DATA[:1024]
    assert ahead(3000, 1024) == DATA[1024:4024]
    assert [(p, s) for p, s, _ in store.fetched[:3]] == [(0, 1024), (1024, 1024), (2048, 1976)]


def test_the_last_window_is_cut_at_the_object_end_and_nothing_is_fetched_past_it(executor):
    store = Store()
    ahead = ReadAhead(store, len(DATA), 4096, executor)
    assert ahead(4096, 4096) == DATA[4096:8192]
    assert ahead(2048, 8192) == DATA[8192:]
    assert max(p + s for p, s, _ in store.fetched) == len(DATA)
    assert ahead(0, len(DATA)) == b""


def test_a_read_elsewhere_is_served_directly_and_restarts_the_read_ahead(executor):
    store = Store()
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    assert ahead(1024, 0) == DATA[:1024]
    assert ahead(100, 5000) == DATA[5000:5100]  # not where the window ahead starts
    assert ahead(1024, 5100) == DATA[5100:6124]  # the window ahead restarted at 5100
    assert (5100, 1024) in [(p, s) for p, s, t in store.fetched if t.startswith("ahead")]


def test_an_error_of_a_background_fetch_is_raised_by_the_read_that_needs_it(executor):
    store = Store(fail_at=2500)
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    assert ahead(1024, 0) == DATA[:1024]
    assert ahead(1024, 1024) == DATA[1024:2048]  # fetched ahead fine; the next window fails behind
    with pytest.raises(CorruptMessageError, match="ends at byte 2500"):
        ahead(1024, 2048)


def test_close_drops_the_window_ahead(executor):
    store = Store()
    ahead = ReadAhead(store, len(DATA), 1024, executor)
    ahead(1024, 0)
    ahead.close()
    assert ahead(1024, 1024) == DATA[1024:2048]  # read directly now


def test_a_window_must_be_positive(executor):
    with pytest.raises(ValueError, match="positive"):
        ReadAhead(Store(), len(DATA), 0, executor)


@settings(max_examples=60)
@given(window=st.integers(1, 3000),
       reads=st.lists(st.tuples(st.integers(0, len(DATA)), st.integers(1, 4000), st.booleans()), max_size=12))
def test_any_reads_return_exactly_the_objects_bytes(window, reads):
    """Sequential or not, larger or smaller than the window: the bytes are the object's."""
    with ThreadPoolExecutor(1) as pool:
        ahead = ReadAhead(Store(), len(DATA), window, pool)
        at = 0
        for position, size, sequential in reads:
            position = at if sequential else position
            size = min(size, len(DATA) - position)
            if size <= 0:
                continue
            assert ahead(size, position) == DATA[position:position + size]
            at = position + size
