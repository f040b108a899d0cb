"""A replica fetcher's round (broker/cluster/replica_fetcher.py) with states its manager no longer
follows: they leave the fetcher, so its loop ends instead of spinning on them without yielding."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from broker.cluster.replica_fetcher import FetchSettings, ReplicaFetcher, ReplicaFetcherManager, _Fetching


def manager() -> ReplicaFetcherManager:
    return ReplicaFetcherManager(FetchSettings(broker_id=1), None, lambda broker: None,  # type: ignore[arg-type]
                                 lambda log: None, lambda: None)


def state(partition: int, leader: int = 2) -> _Fetching:
    target = SimpleNamespace(topic="t", partition=partition)
    return _Fetching(target, leader, epoch=0, truncating=False)  # type: ignore[arg-type]


def test_a_round_drops_the_states_its_manager_no_longer_follows_and_the_loop_ends() -> None:
    """The stop clears what the manager follows; a fetcher whose cancellation did not arrive must
    still end. Before, the round skipped the states (no fetch, no truncation, no await that yields:
    the connection was open) and `_run` called it again at once, for ever."""
    async def run() -> None:
        fetchers = manager()
        fetcher = ReplicaFetcher(fetchers, leader=2)
        followed = [state(0), state(1)]
        fetcher.partitions = {s.key: s for s in followed}
        fetchers._followed = {s.key: s for s in followed}
        fetcher._connection = SimpleNamespace(closed=False, close=lambda: None)  # type: ignore[assignment]
        fetchers._followed.clear()  # what close() does before cancelling the fetchers' tasks
        await fetcher._round()
        assert fetcher.partitions == {}
        await asyncio.wait_for(fetcher._run(), 10)  # returns: nothing left to fetch

    asyncio.run(run())
