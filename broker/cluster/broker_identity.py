"""Inter-broker identity: which connection speaks for which registered broker (docs/cluster.md).

A replica fetch (Fetch or OffsetForLeaderEpoch with `replica_id` >= 0) is a cluster action: the
leader takes its fetch offset as the follower's log end, which moves the high watermark, keeps the
follower in the ISR and so acknowledges acks=all produces. A client that could claim to be a
follower could have records acknowledged that no other replica holds. So a replica fetch is served
only on a connection that proved, at its inter-broker handshake, that it speaks for the registered
broker it names (Kafka asks for CLUSTER_ACTION on the cluster resource).

The proof, until the security issue brings listeners with TLS/SASL: every broker process draws a
random 128-bit `incarnation` at start and writes it into its registration (`brokers/{id}` in the
metadata store, under its lease). The replica fetcher sends `BrokerHandshake{broker_id,
incarnation}` first on every connection; the leader accepts it only if its view of the registered
brokers has that id with that incarnation. Clients never see incarnations (Metadata answers host,
port and rack), so only a process that can read the metadata store (a broker) can make the claim;
a broker that restarts draws a new one, so a stale process cannot speak for its successor. Each
replica fetch checks again that the connection's broker is still registered with its incarnation
(one dict lookup): a broker declared dead and replaced stops moving any high watermark at once.

The seam for credentials: `BrokerIdentity.authenticate` is the one place that decides whether a
handshake proves the claim; with SASL it will also require the connection's principal to be the
inter-broker one. Refusals are CLUSTER_AUTHORIZATION_FAILED and change nothing. Loop-local.
"""
from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from broker.cluster.brokers import LiveBrokers
from common.errors import ClusterAuthorizationFailedError

CONSUMER = -1  # the replica_id of every request that is not a replica's


def new_incarnation() -> str:
    """A broker process's incarnation: 128 random bits, drawn once per start."""
    return secrets.token_hex(16)


@dataclass(slots=True)
class Session:
    """What the broker knows of one connection's peer. Anonymous (no broker) until a handshake
    succeeds on it. Owned by the connection; handlers read and set it on the loop."""

    broker_id: int | None = None
    incarnation: str | None = None


class BrokerIdentity:
    """Checks handshakes and replica fetches against the registered brokers."""

    def __init__(self, brokers: LiveBrokers) -> None:
        self.brokers = brokers

    def authenticate(self, session: Session, broker_id: int, incarnation: str) -> None:
        """Identify `session` as broker `broker_id` if `incarnation` is that broker's registration's;
        CLUSTER_AUTHORIZATION_FAILED (and the session unchanged) otherwise."""
        self._check_registered(broker_id, incarnation)
        session.broker_id, session.incarnation = broker_id, incarnation

    def authorize_replica(self, session: Session, replica_id: int) -> None:
        """Allow a request as replica `replica_id` (a no-op for a consumer's, replica_id -1) only on
        a connection identified as that broker, while it is still registered as it was."""
        if replica_id == CONSUMER:
            return
        if session.broker_id is None or session.incarnation is None:
            raise ClusterAuthorizationFailedError(
                f"a replica fetch as broker {replica_id} needs a connection identified as that broker "
                "(inter-broker handshake); this one is anonymous")
        if session.broker_id != replica_id:
            raise ClusterAuthorizationFailedError(
                f"this connection is broker {session.broker_id}'s; it cannot fetch as broker {replica_id}")
        self._check_registered(replica_id, session.incarnation)

    def authorize_broker(self, session: Session, what: str) -> None:
        """Allow an inter-broker request (`what`, e.g. WriteTxnMarkers) only on a connection
        identified as a registered broker."""
        if session.broker_id is None or session.incarnation is None:
            raise ClusterAuthorizationFailedError(
                f"{what} needs a connection identified as a broker (inter-broker handshake); this one is anonymous")
        self._check_registered(session.broker_id, session.incarnation)

    def _check_registered(self, broker_id: int, incarnation: str) -> None:
        info = self.brokers.brokers.get(broker_id)
        if info is None or not info.incarnation:
            raise ClusterAuthorizationFailedError(f"broker {broker_id} is not registered (as far as this broker knows)")
        if not hmac.compare_digest(info.incarnation.encode(), incarnation.encode()):
            raise ClusterAuthorizationFailedError(
                f"the incarnation given does not match broker {broker_id}'s registration")
