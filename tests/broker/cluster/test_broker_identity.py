"""BrokerIdentity: a connection speaks for a registered broker only after a handshake with that
broker's incarnation, and only while the broker is still registered with it."""
from __future__ import annotations

import pytest

from broker.cluster.broker_identity import BrokerIdentity, Session, new_incarnation
from broker.cluster.brokers import BrokerInfo, LiveBrokers
from common.errors import ClusterAuthorizationFailedError

PROOF = new_incarnation()


@pytest.fixture
def identity() -> BrokerIdentity:
    brokers = LiveBrokers()
    brokers.brokers[1] = BrokerInfo(1, "h", 1, incarnation=PROOF)
    brokers.brokers[2] = BrokerInfo(2, "h", 2)  # registered before incarnations existed
    return BrokerIdentity(brokers)


def test_a_consumer_needs_no_identity(identity):
    identity.authorize_replica(Session(), -1)


@pytest.mark.parametrize("broker_id, proof, match", [
    (1, "0" * 32, "does not match"),
    (3, PROOF, "broker 3 is not registered"),
    (2, "", "broker 2 is not registered"),
], ids=["guessed-incarnation", "unknown-broker", "no-incarnation-registered"])
def test_a_handshake_without_the_registered_incarnation_is_refused_and_changes_nothing(identity, broker_id, proof, match):
    session = Session()
    with pytest.raises(ClusterAuthorizationFailedError, match=match):
        identity.authenticate(session, broker_id, proof)
    assert session == Session()


def test_a_replica_fetch_needs_the_identity_of_the_broker_it_names(identity):
    session = Session()
    with pytest.raises(ClusterAuthorizationFailedError, match="anonymous"):
        identity.authorize_replica(session, 1)
    identity.authenticate(session, 1, PROOF)
    identity.authorize_replica(session, 1)
    with pytest.raises(ClusterAuthorizationFailedError, match="broker 1's; it cannot fetch as broker 2"):
        identity.authorize_replica(session, 2)


def test_an_identity_lapses_when_its_broker_is_no_longer_registered_as_it_was(identity):
    """A broker declared dead (its registration gone) or restarted (a new incarnation) no longer
    speaks through connections identified before."""
    session = Session()
    identity.authenticate(session, 1, PROOF)
    identity.brokers.brokers[1] = BrokerInfo(1, "h", 1, incarnation=new_incarnation())
    with pytest.raises(ClusterAuthorizationFailedError, match="does not match"):
        identity.authorize_replica(session, 1)
    del identity.brokers.brokers[1]
    with pytest.raises(ClusterAuthorizationFailedError, match="not registered"):
        identity.authorize_replica(session, 1)
