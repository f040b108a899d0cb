"""Replication handlers: the inter-broker handshake, and OffsetForLeaderEpoch (where a leader
epoch ends in this leader's log, KIP-101/279).

A replica fetcher (broker/cluster/replica_fetcher.py) sends BrokerHandshake first on each
connection, so that its replica fetches are served (broker/cluster/broker_identity.py), then asks
OffsetForLeaderEpoch before it fetches. Synchronous: the answers come from the registered brokers,
the leader-epoch cache and the log end, all in memory.
"""
from __future__ import annotations

from broker.cluster.broker_identity import BrokerIdentity, Session
from broker.replica_manager import ReplicaManager
from common.errors import PymqError
from protocol import (
    BrokerHandshakeRequest,
    BrokerHandshakeResponse,
    EpochEndOffset,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    TopicResponse,
    code_and_message,
)


class ReplicationHandler:
    def __init__(self, replicas: ReplicaManager, identity: BrokerIdentity) -> None:
        self.replicas = replicas
        self.identity = identity

    def broker_handshake(self, request: BrokerHandshakeRequest, session: Session) -> BrokerHandshakeResponse:
        """Identify the connection as a registered broker; CLUSTER_AUTHORIZATION_FAILED otherwise."""
        self.identity.authenticate(session, request.broker_id, request.incarnation)
        return BrokerHandshakeResponse()

    def offset_for_leader_epoch(self, request: OffsetForLeaderEpochRequest,
                                session: Session) -> OffsetForLeaderEpochResponse:
        self.identity.authorize_replica(session, request.replica_id)
        topics = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                try:
                    if topic.error or p.error:
                        raise topic.error or p.error  # type: ignore[misc]
                    epoch, end_offset = self.replicas.end_offset_for_epoch(topic.name, p.partition,
                                                                           p.current_leader_epoch, p.leader_epoch)
                    answers.append(EpochEndOffset(p.partition, leader_epoch=epoch, end_offset=end_offset))
                except PymqError as err:
                    answers.append(EpochEndOffset(p.partition, *code_and_message(err)))
            topics.append(TopicResponse(topic.name, tuple(answers)))
        return OffsetForLeaderEpochResponse(tuple(topics))
