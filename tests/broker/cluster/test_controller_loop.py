"""The controller's loop (broker/cluster/controller.py `Controller._run`): a poke (brokers came or
went, a partition changed) makes it decide again; a poke that arrives while it is deciding is not
lost to the wait for the next one."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from broker.cluster import controller as controller_module
from broker.cluster.brokers import BrokerInfo, LiveBrokers
from broker.cluster.controller import Controller


async def run_until(controller: Controller, event: asyncio.Event) -> None:
    """Run the controller's loop until `event` is set, then stop it."""
    controller.start()
    try:
        await asyncio.wait_for(event.wait(), 10)  # generous: no other task runs on this loop
    finally:
        controller.epoch = 0  # no controller key to resign (there is no store)
        await controller.stop()


def test_a_poke_while_deciding_makes_the_controller_decide_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reassignment's last target catches up (its leader writes the ISR, the metadata listener
    pokes the controller) while the controller writes the completion of another partition's move.
    The loop cleared its wake-up after deciding, so that poke was lost and the second move
    completed only at the next sweep (10 s later; `pymq partition reassign` waited for it)."""
    monkeypatch.setattr(controller_module, "SWEEP_S", 3600.0)  # a lost poke waits an hour, not 10 s

    async def poked_while_deciding() -> int:
        registration = SimpleNamespace(info=BrokerInfo(1, "127.0.0.1", 9092), lease=1, epoch=1)
        brokers = LiveBrokers()
        brokers.controller = 1
        controller = Controller(None, None, brokers, registration)  # type: ignore[arg-type]
        controller.epoch = 1  # the controller already: no campaign (and no store) needed
        rounds: list[bool] = []
        second = asyncio.Event()

        async def reconcile(preferred: bool = False) -> int:
            rounds.append(preferred)
            if len(rounds) == 1:
                controller.poke()  # a partition changed while this round writes
                await asyncio.sleep(0)  # the round's write to the store
            else:
                second.set()
            return 0

        controller.reconcile = reconcile  # type: ignore[method-assign]
        await run_until(controller, second)
        return len(rounds)

    assert asyncio.run(poked_while_deciding()) >= 2


def test_the_preferred_leader_election_runs_every_rebalance_interval_shorter_than_the_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """leader.imbalance.check.interval.seconds below the 10 s sweep: the controller waited for a
    poke or the sweep only, so the election ran at the sweep, not at its interval (a test that
    set 2 s waited 10 s for leadership to go back to the preferred replica)."""
    monkeypatch.setattr(controller_module, "SWEEP_S", 3600.0)  # an election at the sweep comes in an hour

    async def rounds_until_preferred() -> list[bool]:
        registration = SimpleNamespace(info=BrokerInfo(1, "127.0.0.1", 9092), lease=1, epoch=1)
        brokers = LiveBrokers()
        brokers.controller = 1
        controller = Controller(None, None, brokers, registration, rebalance_interval_s=0.2)  # type: ignore[arg-type]
        controller.epoch = 1  # the controller already: no campaign (and no store) needed
        rounds: list[bool] = []
        elected = asyncio.Event()

        async def reconcile(preferred: bool = False) -> int:
            rounds.append(preferred)
            if preferred:
                elected.set()
            return 0

        controller.reconcile = reconcile  # type: ignore[method-assign]
        await run_until(controller, elected)
        return rounds

    rounds = asyncio.run(rounds_until_preferred())
    assert rounds[0] is False and rounds[-1] is True
