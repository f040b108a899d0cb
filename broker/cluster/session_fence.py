"""SessionFence: a broker acts on leadership only while its view of the cluster is confirmed
(Kafka's broker fencing: a broker that lost its session stops acting on its metadata until it has
registered again and caught up).

A broker learns that leadership moved only through its metadata watch. A broker that hung
(SIGSTOP, a long GC-like stall, a lost network) past `broker.session.timeout.ms` has been declared
dead: its lease expired, the controller moved its leaderships. When it runs again its event loop
first serves the requests queued on its sockets, from the view it had before the pause, and
only then hears from etcd. Without a fence it would answer Metadata naming itself leader with the
old ISR and acknowledge acks=1 produces for partitions it no longer leads (records the new leader
never sees: lost).

The fence holds what proves the view current:
- the last lease renewal etcd acknowledged, timed when it was *sent*: etcd renewed the lease no
  earlier than that, so it lives at least the session timeout from then. Once the session timeout
  has passed since, the lease may have expired and leadership may have moved;
- a lease found expired: the broker was declared dead (until it registers again);
- the revision of its current registration: after registering again, leaderships it read before
  may have moved; the view counts once the metadata listener has applied everything up to that
  revision (the watch delivers the registration itself, so it always gets there).

While fenced the broker acknowledges nothing as leader: produces (and the group coordinator's
appends) answer NOT_LEADER, Metadata answers its own leaderships as LEADER_NOT_AVAILABLE (leader
-1), and clients ask again or ask another broker. Reads are still served: they stop at the high
watermark, which every in-sync replica, and so any new leader, holds. A single broker (no
registration) is never fenced. Loop-local.
"""
from __future__ import annotations

from collections.abc import Callable

from broker.cluster.clock import Clock, SystemClock
from common.errors import NotLeaderError


class SessionFence:
    def __init__(self, broker_id: int, applied_revision: Callable[[], int], clock: Clock | None = None) -> None:
        self.broker_id = broker_id
        self.clock = clock or SystemClock()
        # The revision up to which the broker's replicas follow the metadata (the listener's).
        self._applied_revision = applied_revision
        self._session_s = 0.0  # 0: never registered (a single broker): never fenced
        self._confirmed_at = 0.0  # when the last acknowledged renewal (or grant) was sent
        self._expired = False
        self._revision = 0  # the store's revision at the current registration

    def registered(self, sent_at: float, revision: int, session_s: float) -> None:
        """A registration under a lease granted by a request sent at `sent_at` succeeded at
        `revision`."""
        self._session_s = session_s
        self._confirmed_at = sent_at
        self._expired = False
        self._revision = revision

    def renewed(self, sent_at: float) -> None:
        """etcd acknowledged a renewal of the current lease sent at `sent_at`."""
        self._confirmed_at = max(self._confirmed_at, sent_at)

    def expired(self) -> None:
        """The lease was found expired: the cluster declared this broker dead."""
        self._expired = True

    def reason(self) -> str | None:
        """Why this broker's view of leadership may be stale now, or None if it is confirmed."""
        if not self._session_s:
            return None
        if self._expired:
            return "its registration expired (the cluster declared it dead); it is registering again"
        unconfirmed_s = self.clock.monotonic() - self._confirmed_at
        if unconfirmed_s >= self._session_s:
            return (f"its registration was last confirmed {unconfirmed_s:.1f} s ago, past its session of "
                    f"{self._session_s:g} s (the cluster may have declared it dead)")
        applied = self._applied_revision()
        if applied < self._revision:
            return (f"it registered again at revision {self._revision} and has read the metadata up to "
                    f"revision {applied} only")
        return None

    def check_leader(self, topic: str, partition: int) -> None:
        """NOT_LEADER (retriable: clients refresh their metadata) while fenced."""
        why = self.reason()
        if why is not None:
            raise NotLeaderError(f"broker {self.broker_id} does not act as leader of {topic}-{partition}: {why}")
