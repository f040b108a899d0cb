"""MetadataStore conformance suite (every implementation mixes in `MetadataStoreContract`) and the
local store's own durability: re-opening its file, crashes in the middle of a write, one write
per transaction, leases dropped on load, and its bounded watch history."""
from __future__ import annotations

import asyncio
import copy
import json
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.etcd_metadata_store import EtcdMetadataStore, parse_endpoints
from broker.cluster.etcd_process import EtcdProcess
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.metadata_store import (
    CompactedRevisionError,
    Compare,
    Delete,
    Get,
    LeaseNotFoundError,
    MetadataStore,
    Put,
    VersionConflictError,
    Versioned,
    Watch,
    WatchEvent,
)
from common.errors import InvalidRequestError, MetadataStoreLimitError, MetadataStoreUnavailableError
from tests.helpers.clocks import ManualClock
from tests.waiting import wait_until_async

Scenario = Callable[[MetadataStore], Awaitable[None]]
OpenStore = Callable[[], Awaitable[MetadataStore]]
Advance = Callable[[float], Awaitable[None]]
TIMEOUT_S = 30  # a hang guard: the etcd store's lease tests wait out real TTLs


def run_with(open_store: OpenStore, scenario: Scenario) -> None:
    """Open a store, run `scenario` on it and close it, all on one fresh event loop with a timeout."""

    async def main() -> None:
        store = await open_store()
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))


async def vv(store: MetadataStore, key: str) -> tuple[dict[str, Any], int] | None:
    """(value, version) of `key`, or None when absent: what most tests compare."""
    found = await store.get(key)
    return None if found is None else (found.value, found.version)


async def take(watch: Watch, n: int) -> list[WatchEvent]:
    """The next `n` events of `watch` (the suite's timeout bounds the wait)."""
    return [await anext(watch) for _ in range(n)]


def changes(events: list[WatchEvent]) -> list[tuple[str, str, Any]]:
    return [(e.type, e.key, e.value) for e in events]


class MetadataStoreContract:
    """The contract every MetadataStore passes. A subclass provides three fixtures: `open_store`,
    an async callable returning a store that starts empty for each test (the same data on every
    call within one test); `advance`, an async callable that lets that many seconds pass for the
    store's leases; and `lease_ttl`, the TTL (whole seconds) the lease tests grant."""

    # -- single keys ---------------------------------------------------------------------------

    def test_get_missing_key_returns_none(self, open_store):
        """A key never written reads as None."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.get("topics/absent") is None

        run_with(open_store, scenario)

    def test_put_returns_version_one_then_two(self, open_store):
        """Each write of a key bumps its version by one, and get returns the latest value with it."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.put("topics/a", {"n": 1}) == 1
            assert await vv(store, "topics/a") == ({"n": 1}, 1)
            assert await store.put("topics/a", {"n": 2}) == 2
            assert await vv(store, "topics/a") == ({"n": 2}, 2)
            assert await store.put("topics/b", {"n": 9}) == 1  # versions are per key

        run_with(open_store, scenario)

    def test_put_with_expected_version_zero_creates_only_if_absent(self, open_store):
        """expected_version=0 creates a missing key, and raises VersionConflictError once it exists."""

        async def scenario(store: MetadataStore) -> None:
            assert await store.put("topics/a", {"first": True}, expected_version=0) == 1
            with pytest.raises(VersionConflictError):
                await store.put("topics/a", {"second": True}, expected_version=0)
            assert await vv(store, "topics/a") == ({"first": True}, 1)

        run_with(open_store, scenario)

    @pytest.mark.parametrize("expected_version", [1, 3], ids=["stale", "ahead"])
    def test_put_with_wrong_expected_version_raises_and_keeps_the_value(self, open_store, expected_version):
        """A CAS against a version the key does not have fails and changes nothing; the right version wins."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"v": 1})
            await store.put("topics/a", {"v": 2})
            with pytest.raises(VersionConflictError):
                await store.put("topics/a", {"v": "lost"}, expected_version=expected_version)
            assert await vv(store, "topics/a") == ({"v": 2}, 2)
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
            assert await vv(store, "topics/a") == ({"writer": winners[0]}, 2)

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
            assert await vv(store, "topics/a") == ({"v": 2}, 2)
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
            listed = await store.list("topics/")
            assert {k: (v.value, v.version) for k, v in listed.items()} == {
                "topics/a": ({"n": "a"}, 1), "topics/b": ({"n": "b2"}, 2)}
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
        """Mutating a value returned by get, list, a txn or a watch does not change what the store holds."""

        async def scenario(store: MetadataStore) -> None:
            original = {"replicas": [0, 1], "configs": {"retention.ms": 1}}
            watch = store.watch("topics/")
            await store.put("topics/a", copy.deepcopy(original))
            got = await store.get("topics/a")
            got.value["replicas"].append(2)
            got.value["added"] = True
            listed = (await store.list("topics/"))["topics/a"]
            listed.value["configs"]["retention.ms"] = 99
            (event,) = await take(watch, 1)
            event.value["replicas"].clear()
            read = await store.txn([], [Get("topics/a")])
            read.responses[0]["topics/a"].value["configs"].clear()
            assert (await store.get("topics/a")).value == original

        run_with(open_store, scenario)

    # -- revisions -----------------------------------------------------------------------------

    def test_revision_grows_by_one_per_committed_change_only(self, open_store):
        """Writes bump the store revision by one (a multi-key txn too); reads, failed compares and
        deletes of absent keys leave it; keys record the revisions that created and changed them."""

        async def scenario(store: MetadataStore) -> None:
            start = await store.revision()
            await store.put("topics/a", {"n": 1})
            assert await store.revision() == start + 1
            result = await store.txn([], [Put("topics/a", {"n": 2}), Put("topics/b", {}), Put("topics/c", {})])
            assert result.revision == start + 2 == await store.revision()
            a = await store.get("topics/a")
            assert (a.create_revision, a.mod_revision, a.version) == (start + 1, start + 2, 2)
            assert {(v.create_revision, v.mod_revision) for k, v in (await store.list("topics/")).items()
                    if k != "topics/a"} == {(start + 2, start + 2)}
            await store.get("topics/a")
            await store.txn([Compare.version("topics/a", "==", 7)], [Put("topics/a", {"lost": 1})])
            await store.delete("topics/never")
            assert await store.revision() == start + 2
            await store.delete("topics/c")
            assert await store.revision() == start + 3

        run_with(open_store, scenario)

    # -- transactions --------------------------------------------------------------------------

    def test_txn_success_runs_every_op_in_order_at_one_revision(self, open_store):
        """All compares hold: the success ops run in order (a get sees an earlier put of the same
        txn), responses come in op order, and every write carries the txn's one revision."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})
            await store.put("partitions/a/0", {"leader": 0})
            await store.put("partitions/a/1", {"leader": 0})
            result = await store.txn(
                [Compare.version("topics/a", "==", 1), Compare.version("topics/b", "==", 0),
                 Compare.value("topics/a", "==", {"n": 1})],
                [Put("topics/b", {"n": 2}), Get("topics/b"), Delete("partitions/a/", prefix=True), Get("topics/", prefix=True)],
                [Get("topics/a")],
            )
            assert result.succeeded
            put, got, deleted, listed = result.responses
            assert (put.value, put.version, put.mod_revision) == ({"n": 2}, 1, result.revision)
            assert got["topics/b"].value == {"n": 2}
            assert deleted == 2
            assert set(listed) == {"topics/a", "topics/b"}
            assert await store.list("partitions/") == {}

        run_with(open_store, scenario)

    def test_txn_failed_compare_writes_nothing_and_runs_the_failure_ops(self, open_store):
        """One false compare among true ones: none of the success writes happen, the failure ops
        run and answer, and the revision stays."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})
            await store.put("topics/z", {"n": 26})
            before = await store.revision()
            result = await store.txn(
                [Compare.version("topics/a", "==", 1), Compare.version("topics/b", "==", 3)],
                [Put("topics/a", {"n": 2}), Put("topics/b", {}), Delete("topics/z")],
                [Get("topics/a"), Get("topics/b")],
            )
            assert not result.succeeded
            assert result.responses[0]["topics/a"].value == {"n": 1} and result.responses[1] == {}
            assert result.revision == before == await store.revision()
            assert await vv(store, "topics/a") == ({"n": 1}, 1) and await store.get("topics/b") is None
            assert await vv(store, "topics/z") == ({"n": 26}, 1)

        run_with(open_store, scenario)

    COMPARES = [
        ("version-absent-is-0", Compare.version("k/absent", "==", 0), True),
        ("version-equal", Compare.version("k/two", "==", 2), True),
        ("version-greater", Compare.version("k/two", ">", 1), True),
        ("version-less-false", Compare.version("k/two", "<", 2), False),
        ("version-not-equal", Compare.version("k/two", "!=", 1), True),
        ("value-equal", Compare.value("k/two", "==", {"n": 2}), True),
        ("value-not-equal", Compare.value("k/two", "!=", {"n": 1}), True),
        ("value-of-absent-never-holds", Compare.value("k/absent", "!=", {"n": 1}), False),
        ("mod-revision-absent-is-0", Compare.mod_revision("k/absent", "==", 0), True),
        ("create-before-mod", Compare.create_revision("k/two", "<", 10**9), True),
    ]

    @pytest.mark.parametrize("compare, holds", [c[1:] for c in COMPARES], ids=[c[0] for c in COMPARES])
    def test_compare_targets_and_operators(self, open_store, compare, holds):
        """Each compare target and operator, on present and absent keys (absent: version and revisions 0,
        a value compare fails)."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("k/two", {"n": 1})
            await store.put("k/two", {"n": 2})
            assert (await store.txn([compare], [Get("k/two")], [])).succeeded is holds

        run_with(open_store, scenario)

    def test_mod_revision_compare_guards_a_read_modify_write(self, open_store):
        """A txn conditioned on the mod_revision read earlier fails once someone else wrote the key."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("brokers/0", {"epoch": 1})
            seen = (await store.get("brokers/0")).mod_revision
            await store.put("brokers/0", {"epoch": 2})
            stale = await store.txn([Compare.mod_revision("brokers/0", "==", seen)], [Put("brokers/0", {"epoch": 3})])
            assert not stale.succeeded and (await store.get("brokers/0")).value == {"epoch": 2}

        run_with(open_store, scenario)

    BAD_TXNS = [
        ("same-key-twice", [Put("k/a", {}), Put("k/a", {"again": 1})]),
        ("put-inside-deleted-prefix", [Put("k/a/1", {}), Delete("k/a/", prefix=True)]),
        ("put-then-delete-same-key", [Put("k/b", {}), Delete("k/b")]),
        ("not-an-op", [Put("k/a", {}), "delete k/a"]),
    ]

    @pytest.mark.parametrize("ops", [b[1] for b in BAD_TXNS], ids=[b[0] for b in BAD_TXNS])
    def test_txn_writing_a_key_twice_is_refused_whole(self, open_store, ops):
        """A txn that writes one key twice (or is not made of ops) raises InvalidRequestError and writes nothing."""

        async def scenario(store: MetadataStore) -> None:
            before = await store.revision()
            with pytest.raises(InvalidRequestError):
                await store.txn([], ops)
            assert await store.list("") == {} and await store.revision() == before

        run_with(open_store, scenario)

    def test_txn_put_under_a_missing_lease_writes_nothing(self, open_store):
        """A put naming a lease that does not exist fails the whole txn with LeaseNotFoundError."""

        async def scenario(store: MetadataStore) -> None:
            with pytest.raises(LeaseNotFoundError):
                await store.txn([], [Put("brokers/0", {}), Put("brokers/1", {}, lease=12345)])
            assert await store.list("") == {}

        run_with(open_store, scenario)

    def test_concurrent_txns_on_one_key_have_one_winner_per_version(self, open_store):
        """Eight writers each increment one counter five times by compare-and-set on its version,
        all at once: every version from 2 to 41 is won by exactly one txn, and a watch sees each once."""
        writers, rounds = 8, 5

        async def scenario(store: MetadataStore) -> None:
            await store.put("counters/c", {"n": 0, "by": None})
            watch = store.watch("counters/")
            won: dict[int, int] = {}

            async def writer(number: int) -> None:
                for _ in range(rounds):
                    while True:
                        current = await store.get("counters/c")
                        result = await store.txn(
                            [Compare.version("counters/c", "==", current.version)],
                            [Put("counters/c", {"n": current.value["n"] + 1, "by": number})],
                        )
                        if result.succeeded:
                            version = result.responses[0].version
                            assert version not in won, f"version {version} won twice"
                            won[version] = number
                            break

            await asyncio.gather(*(writer(i) for i in range(writers)))
            assert sorted(won) == list(range(2, writers * rounds + 2))
            assert await vv(store, "counters/c") == ({"n": writers * rounds, "by": won[writers * rounds + 1]},
                                                      writers * rounds + 1)
            events = await take(watch, writers * rounds)
            assert [(e.version, e.value["by"]) for e in events] == sorted(won.items())
            watch.cancel()

        run_with(open_store, scenario)

    # -- watches -------------------------------------------------------------------------------

    def test_watch_yields_each_change_under_its_prefix_in_revision_order(self, open_store):
        """Puts, deletes and multi-key txns under the prefix arrive once each, in commit order, with
        their values, versions and revisions; changes elsewhere do not."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/old", {"before": "the watch"})
            watch = store.watch("topics/")
            await store.put("topics/a", {"n": 1})
            await store.put("brokers/0", {"host": "x"})
            multi = await store.txn([], [Put("topics/a", {"n": 2}), Put("topics/b", {}), Delete("topics/old")])
            await store.delete("topics/b")
            events = await take(watch, 5)
            assert changes(events) == [("put", "topics/a", {"n": 1}), ("put", "topics/a", {"n": 2}),
                                       ("put", "topics/b", {}), ("delete", "topics/old", None),
                                       ("delete", "topics/b", None)]
            assert [e.version for e in events] == [1, 2, 1, 0, 0]
            assert [e.revision for e in events[1:4]] == [multi.revision] * 3
            assert events[0].revision < multi.revision < events[4].revision
            watch.cancel()

        run_with(open_store, scenario)

    def test_watch_from_a_revision_replays_then_follows(self, open_store):
        """watch(start_revision=r) first yields the changes from r on (r included), then live ones."""

        async def scenario(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})
            second = (await store.txn([], [Put("topics/a", {"n": 2})])).revision
            await store.put("topics/b", {"n": 3})
            watch = store.watch("topics/", start_revision=second)
            assert changes(await take(watch, 2)) == [("put", "topics/a", {"n": 2}), ("put", "topics/b", {"n": 3})]
            await store.put("topics/c", {"n": 4})
            assert changes(await take(watch, 1)) == [("put", "topics/c", {"n": 4})]
            watch.cancel()

        run_with(open_store, scenario)

    def test_watch_resumed_after_the_last_seen_revision_misses_nothing(self, open_store):
        """A watcher cancelled mid-stream and resumed from (last revision seen + 1) gets exactly the
        rest, including what was written while it was away."""

        async def scenario(store: MetadataStore) -> None:
            watch = store.watch("k/")
            for i in range(3):
                await store.put(f"k/{i}", {"i": i})
            seen = await take(watch, 2)
            watch.cancel()
            await store.put("k/3", {"i": 3})
            resumed = store.watch("k/", start_revision=seen[-1].revision + 1)
            assert [e.key for e in await take(resumed, 2)] == ["k/2", "k/3"]
            resumed.cancel()

        run_with(open_store, scenario)

    def test_cancel_ends_a_waiting_watch(self, open_store):
        """cancel() makes an iteration that waits for the next change finish without an event."""

        async def scenario(store: MetadataStore) -> None:
            watch = store.watch("k/")
            received: list[WatchEvent] = []

            async def consume() -> None:
                async for event in watch:
                    received.append(event)

            consumer = asyncio.create_task(consume())
            await store.put("k/a", {})
            await wait_until_async(lambda: received, TIMEOUT_S, "the watch delivers the put")
            watch.cancel()
            await consumer
            assert changes(received) == [("put", "k/a", {})]

        run_with(open_store, scenario)

    @pytest.mark.parametrize("start", [0, -1], ids=["zero", "negative"])
    def test_watch_from_a_revision_below_one_is_refused(self, open_store, start):
        """Revisions start at 1: asking to watch from below is an InvalidRequestError."""

        async def scenario(store: MetadataStore) -> None:
            with pytest.raises(InvalidRequestError):
                store.watch("k/", start_revision=start)

        run_with(open_store, scenario)

    # -- leases --------------------------------------------------------------------------------

    def test_lease_expiry_deletes_its_keys_as_one_revision(self, open_store, advance, lease_ttl):
        """A lease not kept alive past its TTL: its keys go in one revision (seen as delete events),
        other keys stay, and the lease can neither be kept alive nor used again."""

        async def scenario(store: MetadataStore) -> None:
            lease = await store.grant_lease(lease_ttl)
            watch = store.watch("brokers/")
            await store.txn([], [Put("brokers/0", {"host": "a"}, lease=lease), Put("brokers/1", {"host": "b"}, lease=lease),
                                 Put("brokers/config", {})])
            assert (await store.get("brokers/0")).lease == lease
            await take(watch, 3)
            await advance(lease_ttl * 1.1)
            deleted = await take(watch, 2)
            assert sorted(changes(deleted)) == [("delete", "brokers/0", None), ("delete", "brokers/1", None)]
            assert deleted[0].revision == deleted[1].revision == await store.revision()
            assert set(await store.list("brokers/")) == {"brokers/config"}
            with pytest.raises(LeaseNotFoundError):
                await store.keep_alive(lease)
            with pytest.raises(LeaseNotFoundError):
                await store.put("brokers/0", {}, lease=lease)
            watch.cancel()

        run_with(open_store, scenario)

    def test_keep_alive_restarts_the_ttl(self, open_store, advance, lease_ttl):
        """Kept alive at 0.6 of its TTL twice, the lease and its key are still there at 1.2 TTL
        (the first deadline passed harmlessly), and expire after 2.3 TTL."""

        async def scenario(store: MetadataStore) -> None:
            lease = await store.grant_lease(lease_ttl)
            await store.put("brokers/0", {}, lease=lease)
            watch = store.watch("brokers/")
            await advance(lease_ttl * 0.6)
            assert await store.keep_alive(lease) == lease_ttl
            await advance(lease_ttl * 0.6)
            assert await store.keep_alive(lease) == lease_ttl
            assert await store.get("brokers/0") is not None
            await advance(lease_ttl * 1.1)
            assert changes(await take(watch, 1)) == [("delete", "brokers/0", None)]
            watch.cancel()

        run_with(open_store, scenario)

    def test_revoke_deletes_the_keys_as_one_revision_and_ends_the_lease(self, open_store):
        """revoke_lease removes every key of the lease at one revision; the lease is gone afterwards."""

        async def scenario(store: MetadataStore) -> None:
            lease = await store.grant_lease(60)
            other = await store.grant_lease(60)
            await store.put("brokers/0", {}, lease=lease)
            await store.put("controller", {"broker": 0}, lease=lease)
            await store.put("brokers/1", {}, lease=other)
            watch = store.watch("")
            await store.revoke_lease(lease)
            deleted = await take(watch, 2)
            assert sorted(e.key for e in deleted) == ["brokers/0", "controller"]
            assert {e.type for e in deleted} == {"delete"} and deleted[0].revision == deleted[1].revision
            assert set(await store.list("")) == {"brokers/1"}
            for call in (store.revoke_lease(lease), store.keep_alive(lease)):
                with pytest.raises(LeaseNotFoundError):
                    await call
            watch.cancel()

        run_with(open_store, scenario)

    def test_a_put_without_lease_detaches_the_key(self, open_store):
        """Rewriting a leased key without a lease takes it out of the lease: revoking leaves it."""

        async def scenario(store: MetadataStore) -> None:
            lease = await store.grant_lease(60)
            await store.put("brokers/0", {"v": 1}, lease=lease)
            await store.put("brokers/0", {"v": 2})
            assert (await store.get("brokers/0")).lease == 0
            await store.revoke_lease(lease)
            assert await vv(store, "brokers/0") == ({"v": 2}, 2)

        run_with(open_store, scenario)

    @pytest.mark.parametrize("ttl_s", [0, -5, math.nan, math.inf], ids=["zero", "negative", "nan", "inf"])
    def test_grant_lease_refuses_a_ttl_that_is_not_a_positive_number(self, open_store, ttl_s):
        """A lease TTL must be a finite positive number of seconds (InvalidRequestError)."""

        async def scenario(store: MetadataStore) -> None:
            with pytest.raises(InvalidRequestError):
                await store.grant_lease(ttl_s)

        run_with(open_store, scenario)


class TestLocalMetadataStore(MetadataStoreContract):
    """The embedded single-file store: the contract, plus persistence and crash safety of its file."""

    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "meta" / "__cluster_metadata.json"

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def open_store(self, path: Path, clock: ManualClock) -> OpenStore:
        async def open_() -> MetadataStore:
            return LocalMetadataStore(path, clock=clock)

        return open_

    @pytest.fixture
    def lease_ttl(self) -> float:
        return 10

    @pytest.fixture
    def advance(self, clock: ManualClock) -> Advance:
        async def advance_(seconds: float) -> None:
            clock.advance(seconds)

        return advance_

    def test_data_survives_reopening_the_file(self, open_store, path):
        """Values, versions, revisions and deletions written by one store are what a new store on the
        same file reads, and the revision carries on from there."""
        revisions: list[int] = []

        async def write(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})
            await store.put("topics/a", {"n": 2})
            await store.put("topics/b", {"n": 3})
            await store.put("topics/c", {"n": 4})
            await store.delete("topics/c")
            revisions.append(await store.revision())

        async def check(store: MetadataStore) -> None:
            assert await store.revision() == revisions[0] == 5
            assert await store.list("") == {"topics/a": Versioned({"n": 2}, 2, 1, 2), "topics/b": Versioned({"n": 3}, 1, 3, 3)}
            assert await store.put("topics/a", {"n": 5}, expected_version=2) == 3  # versions carry on
            assert (await store.get("topics/a")).mod_revision == 6

        run_with(open_store, write)
        assert path.is_file()
        run_with(open_store, check)
        run_with(open_store, lambda store: _expect(store, "topics/a", ({"n": 5}, 3)))

    def test_keys_of_leases_are_dropped_on_load_as_one_revision(self, open_store, path):
        """Leases die with the process: reopening deletes every key a lease owned (one revision),
        keeps the others, and the next write persists that."""

        async def write(store: MetadataStore) -> None:
            lease = await store.grant_lease(3600)
            await store.put("brokers/0", {}, lease=lease)
            await store.put("controller", {"broker": 0}, lease=lease)
            await store.put("topics/a", {"n": 1})

        async def check(store: MetadataStore) -> None:
            assert set(await store.list("")) == {"topics/a"}
            assert await store.revision() == 4
            await store.put("topics/b", {})

        run_with(open_store, write)
        run_with(open_store, check)
        assert set(json.loads(path.read_text())["keys"]) == {"topics/a", "topics/b"}

    def test_reads_the_first_file_format(self, open_store, path):
        """A file written before revisions existed (key -> value and version) loads, at revision 1."""
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"topics/a": {"value": {"n": 1}, "version": 3}}))

        async def check(store: MetadataStore) -> None:
            assert await store.get("topics/a") == Versioned({"n": 1}, 3, 1, 1)
            assert await store.put("topics/a", {"n": 2}, expected_version=3) == 4
            assert await store.revision() == 2

        run_with(open_store, check)

    def test_stray_temp_file_from_a_crash_mid_write_is_ignored(self, open_store, path):
        """A torn `.tmp` left by a crash before the rename: reopening reads the old file, and writing goes on."""

        async def write(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})

        run_with(open_store, write)
        before = path.read_bytes()
        path.with_suffix(".tmp").write_text('{"format": 2, "revision": 2, "keys": {"topics/a": {"value": {"n": 2}, "vers')
        assert path.read_bytes() == before

        async def after_crash(store: MetadataStore) -> None:
            assert await vv(store, "topics/a") == ({"n": 1}, 1)
            assert await store.put("topics/a", {"n": 3}, expected_version=1) == 2

        run_with(open_store, after_crash)
        stored = json.loads(path.read_text())
        assert stored["revision"] == 2 and stored["keys"]["topics/a"]["value"] == {"n": 3}
        assert not path.with_suffix(".tmp").exists()

    def test_failed_write_leaves_old_state_in_memory_and_on_disk(self, open_store, path, monkeypatch):
        """If the rename of a write fails (a crash stand-in), the txn raises and the store, its file, its
        revision and its watchers keep the old state; the next write succeeds."""

        async def seed(store: MetadataStore) -> None:
            await store.put("topics/a", {"n": 1})

        run_with(open_store, seed)
        real_replace = os.replace

        def failing_replace(src, dst, *args, **kwargs):
            raise OSError(28, "No space left on device (injected)")

        async def crash(store: MetadataStore) -> None:
            watch = store.watch("")
            monkeypatch.setattr(os, "replace", failing_replace)
            try:
                with pytest.raises(OSError):
                    await store.put("topics/a", {"n": 2})
                with pytest.raises(OSError):
                    await store.delete("topics/a")
                with pytest.raises(OSError):
                    await store.txn([], [Put("topics/b", {}), Put("partitions/b/0", {})])
            finally:
                monkeypatch.setattr(os, "replace", real_replace)
            assert await vv(store, "topics/a") == ({"n": 1}, 1) and await store.revision() == 1
            assert set(await store.list("")) == {"topics/a"}
            assert await store.put("topics/a", {"n": 3}) == 2
            assert changes(await take(watch, 1)) == [("put", "topics/a", {"n": 3})]  # no event of the failed writes
            watch.cancel()

        run_with(open_store, crash)
        assert json.loads(path.read_text())["keys"]["topics/a"]["value"] == {"n": 3}

    def test_a_transaction_is_one_durable_write_however_many_keys(self, open_store, path, monkeypatch):
        """A 2,001-key txn writes the file once: one rename, fsyncs of the file and its directory only."""
        calls: list[str] = []
        real_replace, real_fsync = os.replace, os.fsync
        monkeypatch.setattr(os, "replace", lambda *a, **k: (calls.append("replace"), real_replace(*a, **k))[1])
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])

        async def scenario(store: MetadataStore) -> None:
            ops = [Put("topics/big", {"partitions": 2000})] + [Put(f"partitions/big/{p}", {"leader": 0}) for p in range(2000)]
            await store.txn([Compare.version("topics/big", "==", 0)], ops)

        run_with(open_store, scenario)
        assert calls == ["fsync", "replace", "fsync"]
        assert len(json.loads(path.read_text())["keys"]) == 2001

    def test_new_store_on_a_missing_file_is_empty_and_creates_its_directory(self, open_store, path):
        """No file yet: the store starts empty; the first write creates the parent directory and the file."""
        assert not path.parent.exists()

        async def scenario(store: MetadataStore) -> None:
            assert await store.list("") == {} and await store.revision() == 0
            await store.put("brokers/0", {"host": "127.0.0.1"})

        run_with(open_store, scenario)
        assert path.is_file()

    def test_watch_from_before_a_reopen_is_compacted(self, open_store):
        """The history starts empty on load: watching from an older revision raises
        CompactedRevisionError naming the compacted revision; from the next one works."""

        async def write(store: MetadataStore) -> None:
            await store.put("topics/a", {})
            await store.put("topics/b", {})

        async def check(store: MetadataStore) -> None:
            with pytest.raises(CompactedRevisionError) as raised:
                await anext(store.watch("topics/", start_revision=1))
            assert raised.value.compacted_revision == 2
            watch = store.watch("topics/", start_revision=3)
            await store.put("topics/c", {})
            assert changes(await take(watch, 1)) == [("put", "topics/c", {})]

        run_with(open_store, write)
        run_with(open_store, check)

    def test_a_watcher_left_behind_by_the_bounded_history_gets_compacted(self, path, clock):
        """With room for 3 events, a watcher that has not read 4 revisions gets CompactedRevisionError
        instead of silently skipping; the newest revision is kept whole even when larger."""

        async def scenario() -> None:
            store = LocalMetadataStore(path, clock=clock, history_max_events=3)
            try:
                slow = store.watch("k/")
                for i in range(4):
                    await store.put(f"k/{i}", {})
                with pytest.raises(CompactedRevisionError):
                    await anext(slow)
                big = store.watch("k/")
                await store.txn([], [Put(f"k/big/{i}", {}) for i in range(5)])
                assert len(await take(big, 5)) == 5
            finally:
                await store.close()

        asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S))

    def test_close_ends_watches_and_leases(self, open_store):
        """Closing the store finishes every pending watch iteration and forgets its leases."""

        async def scenario(store: MetadataStore) -> None:
            watch = store.watch("")
            waiting = asyncio.create_task(anext(watch, None))
            lease = await store.grant_lease(60)
            await asyncio.sleep(0)  # a loop turn, not a wait on time: the waiting task starts its iteration
            await store.close()
            assert await waiting is None
            with pytest.raises(LeaseNotFoundError):
                await store.keep_alive(lease)

        run_with(open_store, scenario)


async def _expect(store: MetadataStore, key: str, expected: tuple[dict[str, Any], int]) -> None:
    assert await vv(store, key) == expected


@pytest.mark.parametrize("target, op, operand", [("lease", "==", 0), ("value", "<", {}), ("version", "<=", 1)],
                         ids=["unknown-target", "value-ordering", "unknown-operator"])
def test_a_malformed_compare_is_refused(target, op, operand):
    """Compare checks its target and operator when built (InvalidRequestError), not when a store runs it."""
    with pytest.raises(InvalidRequestError):
        Compare("topics/a", target, op, operand)


def test_etcd_endpoints_are_a_comma_separated_list_of_host_port():
    assert parse_endpoints("127.0.0.1:2379") == [("127.0.0.1", 2379)]
    assert parse_endpoints("etcd-0:2379, etcd-1:2379,[::1]:2379") == [("etcd-0", 2379), ("etcd-1", 2379), ("[::1]", 2379)]
    for bad in ("", "etcd-0", "etcd-0:", ":2379", "etcd-0:port", "etcd-0:2379,", "etcd-0:70000"):
        with pytest.raises(InvalidRequestError, match="host:port"):
            parse_endpoints(bad)


class TestEtcdMetadataStore(MetadataStoreContract):
    """The etcd store against a real etcd: the contract (each test in a namespace of its own, real
    lease TTLs), plus what only a remote store has: a watch surviving a broken stream, named errors
    when etcd is away or refuses a transaction's size."""

    @pytest.fixture
    def open_store(self, etcd, request) -> OpenStore:
        namespace = f"test/{request.node.name}/{os.urandom(4).hex()}/"

        async def open_() -> MetadataStore:
            return await EtcdMetadataStore.connect(etcd.endpoint, namespace)

        return open_

    @pytest.fixture
    def lease_ttl(self) -> float:
        return 3  # above etcd's minimum TTL (1.5 x its election timeout, 1 s by default)

    @pytest.fixture
    def advance(self) -> Advance:
        return asyncio.sleep

    def test_a_watch_resumes_across_an_etcd_restart_without_missing_a_change(self, tmp_path):
        """etcd stops while a watch waits and changes are made after it returns: the watch delivers
        every change, once, in order; a call while etcd is down fails as METADATA_STORE_UNAVAILABLE."""
        server = EtcdProcess(tmp_path / "etcd").start()

        async def scenario() -> None:
            store = await EtcdMetadataStore.connect(server.endpoint, "ns/", timeout_s=1)
            try:
                watch = store.watch("k/")
                await store.put("k/before", {"n": 0})
                assert changes(await take(watch, 1)) == [("put", "k/before", {"n": 0})]
                await asyncio.to_thread(server.stop)
                with pytest.raises(MetadataStoreUnavailableError):
                    await store.put("k/during", {})
                await asyncio.to_thread(server.start)
                async def answers() -> bool:  # the channel reconnects after its backoff: retriable until then
                    await store.revision()
                    return True

                await wait_until_async(answers, 10, "the store answers again", 0.1, tolerate=(MetadataStoreUnavailableError,))
                await store.put("k/after", {"n": 1})
                await store.delete("k/before")
                assert changes(await take(watch, 2)) == [("put", "k/after", {"n": 1}), ("delete", "k/before", None)]
                watch.cancel()
            finally:
                await store.close()

        try:
            asyncio.run(asyncio.wait_for(scenario(), 60))
        finally:
            server.stop()

    def test_a_hung_etcd_is_a_named_retriable_error_within_the_timeout(self, etcd):
        """etcd stopped with SIGSTOP: a transaction fails as METADATA_STORE_UNAVAILABLE (retriable)
        after the store's timeout, not after a TCP timeout; it works again once etcd continues."""

        async def scenario() -> None:
            store = await EtcdMetadataStore.connect(etcd.endpoint, f"hang/{os.urandom(4).hex()}/", timeout_s=0.5)
            try:
                etcd.pause()
                try:
                    with pytest.raises(MetadataStoreUnavailableError) as caught:
                        await asyncio.wait_for(store.put("k", {}), 5)
                    assert caught.value.retriable
                finally:
                    etcd.resume()
                assert await store.put("k", {"ok": True}) >= 1
            finally:
                await store.close()

        asyncio.run(scenario())

    def test_a_topic_of_max_partitions_is_one_transaction(self, etcd, tmp_path):
        """The largest topic (10,000 partition states and its key) is one etcd transaction on an etcd
        started with pymq's limits; an etcd on its defaults refuses it as METADATA_STORE_LIMIT,
        naming the flags, and stores nothing."""
        from broker.cluster.topics import MAX_PARTITIONS

        state = {"leader": 1, "leader_epoch": 0, "replicas": [1, 2, 3], "isr": [1, 2, 3]}
        ops = [Put("topics/big", {"partitions": MAX_PARTITIONS}),
               *(Put(f"partitions/big/{p}", state) for p in range(MAX_PARTITIONS))]

        async def create(endpoint: str) -> MetadataStore:
            store = await EtcdMetadataStore.connect(endpoint, f"big/{os.urandom(4).hex()}/", timeout_s=30)
            await store.txn([Compare.version("topics/big", "==", 0)], ops)
            return store

        async def scenario() -> None:
            store = await create(etcd.endpoint)
            try:
                assert len(await store.list("partitions/big/")) == MAX_PARTITIONS
            finally:
                await store.close()
            with EtcdProcess(tmp_path / "defaults", limits=()) as defaults:
                with pytest.raises(MetadataStoreLimitError, match="--max-txn-ops"):
                    await create(defaults.endpoint)
                check = await EtcdMetadataStore.connect(defaults.endpoint, "big/")
                try:
                    assert await check.list("") == {}
                finally:
                    await check.close()

        asyncio.run(scenario())
