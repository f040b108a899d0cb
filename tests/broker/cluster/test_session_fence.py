"""SessionFence: a broker's view of leadership counts only while its lease is confirmed within
the session timeout and, after registering again, once it has read the metadata up to its new
registration (the end-to-end case, a leader resumed after SIGSTOP, is tests/e2e/test_resumed_broker.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.cluster.brokers import BrokerInfo, BrokerRegistration
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.session_fence import SessionFence
from common.errors import NotLeaderError
from tests.helpers.clocks import ManualClock
from tests.waiting import wait_until_async

TIMEOUT_S = 20


def test_the_fence_holds_from_the_session_timeout_after_the_last_confirmation_until_a_renewal():
    clock, applied = ManualClock(), [7]
    fence = SessionFence(1, lambda: applied[0], clock)
    assert fence.reason() is None, "a broker that never registered (a single broker) is never fenced"
    fence.registered(clock.monotonic(), 7, 3)
    assert fence.reason() is None
    clock.advance(2.9)
    assert fence.reason() is None
    fence.renewed(clock.monotonic() - 0.5)  # sent half a second ago, acknowledged now
    clock.advance(2.4)
    assert fence.reason() is None
    clock.advance(0.1)
    assert "last confirmed 3.0 s ago" in fence.reason()
    with pytest.raises(NotLeaderError, match="broker 1 does not act as leader of t-0"):
        fence.check_leader("t", 0)
    fence.renewed(clock.monotonic())
    assert fence.reason() is None
    fence.check_leader("t", 0)


def test_after_an_expired_lease_the_fence_holds_until_the_metadata_reaches_the_new_registration():
    clock, applied = ManualClock(), [7]
    fence = SessionFence(1, lambda: applied[0], clock)
    fence.registered(clock.monotonic(), 7, 3)
    fence.expired()
    assert "expired" in fence.reason()
    fence.registered(clock.monotonic(), 12, 3)
    assert "registered again at revision 12 and has read the metadata up to revision 7" in fence.reason()
    applied[0] = 12
    assert fence.reason() is None


def test_a_registration_reports_its_lease_so_a_lapsed_broker_is_fenced_until_registered_and_caught_up(tmp_path: Path):
    """Over the local store with a manual clock: the lease lapses (the clock jumps past the
    session, as over a SIGSTOP): fenced at once; the keep-alive finds the lease gone and registers
    again; fenced until the metadata listener has applied the new registration's revision."""

    async def main() -> None:
        clock = ManualClock()
        store = LocalMetadataStore(tmp_path / "meta.json", clock=clock)
        applied = [0]
        fence = SessionFence(1, lambda: applied[0], clock)
        registration = BrokerRegistration(store, BrokerInfo(1, "127.0.0.1", 9092), 1000, fence=fence)
        try:
            first = (await registration.register()).epoch
            assert fence.reason() is not None, "fenced until the metadata up to the registration is read"
            applied[0] = await store.revision()
            assert fence.reason() is None
            registration.start()
            clock.advance(1.5)  # the lease (1 s) expires in the store, unrenewed
            assert "last confirmed 1.5 s ago" in fence.reason()
            await wait_until_async(lambda: registration.epoch != first, 10,
                                   "the keep-alive (every 1/3 s) registers again", 0.05)
            assert f"has read the metadata up to revision {applied[0]}" in fence.reason()
            applied[0] = await store.revision()
            assert fence.reason() is None
        finally:
            await registration.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))
