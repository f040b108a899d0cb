"""FileCache: a bounded LRU of segment descriptors that never closes one in use."""
from __future__ import annotations

import os
import random
import threading
from contextlib import ExitStack

import pytest

from common.errors import KafkaStorageError
from broker.log import FileCache


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def files(tmp_path):
    """Ten small files, each holding its own name."""
    paths = []
    for i in range(10):
        path = tmp_path / f"{i:020d}.log"
        path.write_bytes(path.name.encode())
        paths.append(path)
    return paths


def read_through(cache: FileCache, path) -> bytes:
    with cache.pinned(path) as fd:
        return os.pread(fd, 100, 0)


def test_never_more_than_max_open_idle_descriptors(files):
    cache = FileCache(max_open=3)
    before = open_fds()
    for path in files * 2:
        assert read_through(cache, path) == path.name.encode()
        assert len(cache) <= 3
    assert open_fds() - before == len(cache) == 3
    assert cache.opened == 20  # round-robin over 10 files through 3 slots: every access misses
    cache.close()
    assert len(cache) == 0 and open_fds() == before


def test_eviction_closes_the_least_recently_used(files):
    cache = FileCache(max_open=2)
    a, b, c = files[:3]
    read_through(cache, a)
    read_through(cache, b)
    read_through(cache, a)  # a is now more recent than b
    read_through(cache, c)  # evicts b
    assert cache.opened == 3
    read_through(cache, a)
    assert cache.opened == 3  # a stayed open
    read_through(cache, b)
    assert cache.opened == 4  # b had been closed
    cache.close()


def test_pinned_descriptors_are_never_closed_and_the_cache_shrinks_once_released(files):
    """With every slot pinned the cache grows past max_open rather than fail, for as long as the
    pins last; released, it is back within max_open."""
    cache = FileCache(max_open=1)
    before = open_fds()
    with ExitStack() as stack:
        fds = [stack.enter_context(cache.pinned(path)) for path in files[:4]]
        assert len(cache) == 4
        assert [os.pread(fd, 100, 0) for fd in fds] == [p.name.encode() for p in files[:4]]
    assert len(cache) <= 1 and open_fds() - before <= 1
    cache.close()
    assert open_fds() == before


def test_forgetting_a_pinned_descriptor_closes_it_when_the_last_user_is_done(files):
    cache = FileCache()
    before = open_fds()
    with cache.pinned(files[0]) as fd:
        cache.forget(files[0])
        assert len(cache) == 0
        assert os.pread(fd, 100, 0) == files[0].name.encode()  # still valid for its user
    assert open_fds() == before
    cache.close()


def test_rename_keeps_the_open_descriptor(files, tmp_path):
    cache = FileCache()
    read_through(cache, files[0])
    renamed = tmp_path / "renamed.log.deleted"
    os.rename(files[0], renamed)
    cache.rename(files[0], renamed)
    assert read_through(cache, renamed) == files[0].name.encode()
    assert cache.opened == 1
    cache.close()


def test_dup_outlives_eviction_and_close(files):
    cache = FileCache(max_open=1)
    fd = cache.dup(files[0])
    try:
        read_through(cache, files[1])  # evicts files[0]'s cached descriptor
        cache.close()
        assert os.pread(fd, 100, 0) == files[0].name.encode()
    finally:
        os.close(fd)


def test_missing_file_is_a_storage_error(tmp_path):
    cache = FileCache()
    with pytest.raises(KafkaStorageError, match="cannot open"):
        read_through(cache, tmp_path / "gone.log")
    assert len(cache) == 0 and cache.opened == 0


def test_max_open_must_be_positive():
    with pytest.raises(ValueError):
        FileCache(max_open=0)


def test_threads_sharing_a_small_cache_read_the_right_files_and_leak_nothing(files):
    """Smoke test: eight threads pin, read, dup and forget random files through four slots."""
    cache = FileCache(max_open=4)
    before = open_fds()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                path = rng.choice(files)
                action = rng.random()
                if action < 0.1:
                    cache.forget(path)
                elif action < 0.2:
                    fd = cache.dup(path)
                    try:
                        assert os.pread(fd, 100, 0) == path.name.encode()
                    finally:
                        os.close(fd)
                else:
                    assert read_through(cache, path) == path.name.encode()
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len(cache) <= 4
    cache.close()
    assert open_fds() == before


def test_rename_while_pinned_keeps_the_descriptor_cached_and_open(files, tmp_path):
    """The release of a pin taken under the old name must not mistake the renamed entry for a
    forgotten one and close a descriptor the cache still hands out."""
    cache = FileCache()
    renamed = tmp_path / "renamed.log.deleted"
    with cache.pinned(files[0]):
        os.rename(files[0], renamed)
        cache.rename(files[0], renamed)
    assert read_through(cache, renamed) == files[0].name.encode()
    assert cache.opened == 1
    cache.close()
