"""MetadataStore conformance suite (every implementation mixes in `MetadataStoreContract`) and the
local store's own durability: re-opening its file, and crashes in the middle of a write."""
from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.cluster.metadata_store import LocalMetadataStore, MetadataStore, VersionConflictError, Versioned

Scenario = Callable[[MetadataStore], Awaitable[None]]
OpenStore = Callable[[], Awaitable[MetadataStore]]
TIMEOUT_S = 10


def run_with(open_store: OpenStore, scenario: Scenario) -> None:
    """Open a store, run `scenario` on it and close it, all on one fresh event loop with a timeout."""

    async def main() -> None:
        store = await open_store()
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


class MetadataStoreContract:
    """The contract every MetadataStore passes. A subclass provides the `open_store` fixture: an async
    callable returning a store that starts empty for each test (the same data on every call within one test)."""

    def test_get_missing_key_returns_none(self, open_store):
        """A key never written reads as None."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.get("topics/absent") is None

        run_with(open_store, scenario)

    def test_put_returns_version_one_then_two(self, open_store):
        """Each write of a key bumps its version by one, and get returns the latest value with it."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.put("topics/a", {"n": 1}) == 1
            assert await store.get("topics/a") == Versioned({"n": 1}, 1)
            assert await store.put("topics/a", {"n": 2}) == 2
            assert await store.get("topics/a") == Versioned({"n": 2}, 2)
            assert await store.put("topics/b", {"n": 9}) == 1  # versions are per key

        run_with(open_store, scenario)

    def test_put_with_expected_version_zero_creates_only_if_absent(self, open_store):
        """expected_version=0 creates a missing key, and raises VersionConflictError once it exists."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.put("topics/a", {"first": True}, expected_version=0) == 1
            with pytest.raises(VersionConflictError):
                await store.put("topics/a", {"second": True}, expected_version=0)
            assert await store.get("topics/a") == Versioned({"first": True}, 1)

        run_with(open_store, scenario)

    @pytest.mark.parametrize("expected_version", [1, 3], ids=["stale", "ahead"])
    def test_put_with_wrong_expected_version_raises_and_keeps_the_value(self, open_store, expected_version):
        """A CAS against a version the key does not have fails and changes nothing; the right version wins."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"v": 1})
            await store.put("topics/a", {"v": 2})
            with pytest.raises(VersionConflictError):
                await store.put("topics/a", {"v": "lost"}, expected_version=expected_version)
            assert await store.get("topics/a") == Versioned({"v": 2}, 2)
            assert await store.put("topics/a", {"v": 3}, expected_version=2) == 3

        run_with(open_store, scenario)

    def test_put_with_expected_version_on_missing_key_raises(self, open_store):
        """expected_version=N>0 on a key that does not exist is a conflict, and nothing is created."""

        async def scenario(store: MetadataStore) -> None:
            with pytest.raises(VersionConflictError):
                await store.put("topics/a", {"v": 1}, expected_version=1)
            assert await store.get("topics/a") is None

        run_with(open_store, scenario)

    def test_concurrent_compare_and_set_has_exactly_one_winner(self, open_store):
        """Five writers CAS against the same version at once: one succeeds, four get VersionConflictError."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"writer": None})
            outcomes = await asyncio.gather(
                *(store.put("topics/a", {"writer": i}, expected_version=1) for i in range(5)), return_exceptions=True
            )
            winners = [i for i, o in enumerate(outcomes) if o == 2]
            assert len(winners) == 1
            assert all(isinstance(o, VersionConflictError) for i, o in enumerate(outcomes) if i not in winners)
            assert await store.get("topics/a") == Versioned({"writer": winners[0]}, 2)

        run_with(open_store, scenario)

    def test_delete_without_version_removes_and_reports_existence(self, open_store):
        """delete returns True for an existing key (which is then gone) and False for a missing one."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"v": 1})
            assert await store.delete("topics/a") is True
            assert await store.get("topics/a") is None
            assert await store.delete("topics/a") is False
            assert await store.delete("topics/never") is False

        run_with(open_store, scenario)

    def test_delete_with_expected_version_is_compare_and_set(self, open_store):
        """delete with the wrong version raises and keeps the key; with the right one removes it."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"v": 1})
            await store.put("topics/a", {"v": 2})
            for wrong in (0, 1, 3):
                with pytest.raises(VersionConflictError):
                    await store.delete("topics/a", expected_version=wrong)
            assert await store.get("topics/a") == Versioned({"v": 2}, 2)
            assert await store.delete("topics/a", expected_version=2) is True
            assert await store.get("topics/a") is None

        run_with(open_store, scenario)

    def test_delete_missing_key_with_expected_version(self, open_store):
        """On a missing key, expected_version=0 matches (False returned); any other version is a conflict."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.delete("topics/a", expected_version=0) is False
            with pytest.raises(VersionConflictError):
                await store.delete("topics/a", expected_version=1)

        run_with(open_store, scenario)

    def test_put_after_delete_starts_again_at_version_one(self, open_store):
        """A deleted key is absent: re-creating it with expected_version=0 works and gives version 1."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"v": 1})
            await store.put("topics/a", {"v": 2})
            await store.delete("topics/a")
            assert await store.put("topics/a", {"v": "again"}, expected_version=0) == 1

        run_with(open_store, scenario)

    def test_list_returns_every_key_under_a_prefix(self, open_store):
        """list(prefix) gives exactly the keys starting with it, with values and versions."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": "a"})
            await store.put("topics/b", {"n": "b"})
            await store.put("topics/b", {"n": "b2"})
            await store.put("topicsx", {"n": "x"})
            await store.put("partitions/a/0", {"leader": 0})
            await store.put("partitions/a/1", {"leader": 0})
            await store.put("partitions/ab/0", {"leader": 0})
            assert await store.list("topics/") == {
                "topics/a": Versioned({"n": "a"}, 1),
                "topics/b": Versioned({"n": "b2"}, 2),
            }
            assert set(await store.list("partitions/a/")) == {"partitions/a/0", "partitions/a/1"}
            assert set(await store.list("")) == {"topics/a", "topics/b", "topicsx", "partitions/a/0",
                                                 "partitions/a/1", "partitions/ab/0"}
            assert await store.list("brokers/") == {}
            await store.delete("topics/a")
            assert set(await store.list("topics/")) == {"topics/b"}

        run_with(open_store, scenario)

    def test_values_round_trip_every_json_type(self, open_store):
        """Nested dicts and lists of str, int, float, bool and None come back equal."""
        value = {"s": "x\u00e9", "i": -(2**53), "f": 1.5, "t": True, "f0": False, "none": None,
                 "list": [1, "two", [3], {"four": 4}], "nested": {"a": {"b": []}}}

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", value)
            assert (await store.get("topics/a")).value == value
            assert (await store.list("topics/"))["topics/a"].value == value

        run_with(open_store, scenario)

    def test_stored_value_is_a_copy_of_what_was_put(self, open_store):
        """Mutating the dict passed to put (even nested parts) afterwards does not change the stored value."""

        async def scenario(store: MetadataStore) -> None:
            value = {"replicas": [0, 1], "configs": {"retention.ms": 1}}
            await store.put("topics/a", value)
            value["replicas"].append(2)
            value["configs"]["retention.ms"] = 2
            value["new"] = True
            assert (await store.get("topics/a")).value == {"replicas": [0, 1], "configs": {"retention.ms": 1}}

        run_with(open_store, scenario)

    def test_values_read_back_are_copies(self, open_store):
        """Mutating a value returned by get or list does not change what the store holds."""

        async def scenario(store: MetadataStore) -> None:
            original = {"replicas": [0, 1], "configs": {"retention.ms": 1}}
            await store.put("topics/a", copy.deepcopy(original))
            got = await store.get("topics/a")
            got.value["replicas"].append(2)
            got.value["added"] = True
            listed = (await store.list("topics/"))["topics/a"]
            listed.value["configs"]["retention.ms"] = 99
            assert (await store.get("topics/a")).value == original

        run_with(open_store, scenario)


class TestLocalMetadataStore(MetadataStoreContract):
    """The embedded single-file store: the contract, plus persistence and crash safety of its file."""

    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "meta" / "__cluster_metadata.json"

    @pytest.fixture
    def open_store(self, path: Path) -> OpenStore:
        async def open_() -> MetadataStore:
            return LocalMetadataStore(path)

        return open_

    def test_values_read_back_are_copies(self, open_store):
        super().test_values_read_back_are_copies(open_store)

    def test_data_survives_reopening_the_file(self, open_store, path):
        """Values, versions and deletions written by one store are what a new store on the same file reads."""

        async def write(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})
            await store.put("topics/a", {"n": 2})
            await store.put("topics/b", {"n": 3})
            await store.put("topics/c", {"n": 4})
            await store.delete("topics/c")

        async def check(store: MetadataStore) -> None:
            assert await store.list("") == {"topics/a": Versioned({"n": 2}, 2), "topics/b": Versioned({"n": 3}, 1)}
            assert await store.put("topics/a", {"n": 5}, expected_version=2) == 3  # versions carry on

        run_with(open_store, write)
        assert path.is_file()
        run_with(open_store, check)
        run_with(open_store, lambda store: _expect(store, "topics/a", Versioned({"n": 5}, 3)))

    def test_stray_temp_file_from_a_crash_mid_write_is_ignored(self, open_store, path):
        """A torn `.tmp` left by a crash before the rename: reopening reads the old file, and writing goes on."""

        async def write(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})

        run_with(open_store, write)
        before = path.read_bytes()
        path.with_suffix(".tmp").write_text('{"topics/a": {"value": {"n": 2}, "vers')  # torn new map
        assert path.read_bytes() == before

        async def after_crash(store: MetadataStore) -> None:
            assert await store.get("topics/a") == Versioned({"n": 1}, 1)
            assert await store.put("topics/a", {"n": 3}, expected_version=1) == 2

        run_with(open_store, after_crash)
        assert json.loads(path.read_text()) == {"topics/a": {"value": {"n": 3}, "version": 2}}
        assert not path.with_suffix(".tmp").exists()

    def test_failed_write_leaves_old_state_in_memory_and_on_disk(self, open_store, path, monkeypatch):
        """If the rename of a write fails (a crash stand-in), put raises and both the store and its file keep
        the old value; the next write succeeds."""

        async def seed(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})

        run_with(open_store, seed)
        real_replace = os.replace

        def failing_replace(src, dst, *args, **kwargs):
            raise OSError(28, "No space left on device (injected)")

        async def crash(store: MetadataStore) -> None:
            monkeypatch.setattr(os, "replace", failing_replace)
            try:
                with pytest.raises(OSError):
                    await store.put("topics/a", {"n": 2})
                with pytest.raises(OSError):
                    await store.delete("topics/a")
            finally:
                monkeypatch.setattr(os, "replace", real_replace)
            assert await store.get("topics/a") == Versioned({"n": 1}, 1)
            assert await store.put("topics/a", {"n": 3}) == 2

        run_with(open_store, crash)
        assert json.loads(path.read_text()) == {"topics/a": {"value": {"n": 3}, "version": 2}}

    def test_new_store_on_a_missing_file_is_empty_and_creates_its_directory(self, open_store, path):
        """No file yet: the store starts empty; the first write creates the parent directory and the file."""
        assert not path.parent.exists()

        async def scenario(store: MetadataStore) -> None:
            assert await store.list("") == {}
            await store.put("brokers/0", {"host": "127.0.0.1"})

        run_with(open_store, scenario)
        assert path.is_file()


async def _expect(store: MetadataStore, key: str, expected: Versioned) -> None:
    assert await store.get(key) == expected
