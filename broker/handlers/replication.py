"""OffsetForLeaderEpoch handler: where a leader epoch ends in this leader's log (KIP-101/279).

Followers ask it before they fetch (broker/cluster/replica_fetcher.py). Synchronous: the answer
is the leader-epoch cache and the log end, both in memory.
"""
from __future__ import annotations

from broker.errors import PymqError
from broker.protocol import (
    EpochEndOffset,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    TopicResponse,
    code_and_message,
)
from broker.replica_manager import ReplicaManager


class ReplicationHandler:
    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    def offset_for_leader_epoch(self, request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
        topics = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                try:
                    if topic.error or p.error:
                        raise topic.error or p.error  # type: ignore[misc]
                    log = self.replicas.leader_log(topic.name, p.partition, p.current_leader_epoch)
                    epoch, end_offset = log.end_offset_for_epoch(p.leader_epoch)
                    answers.append(EpochEndOffset(p.partition, leader_epoch=epoch, end_offset=end_offset))
                except PymqError as err:
                    answers.append(EpochEndOffset(p.partition, *code_and_message(err)))
            topics.append(TopicResponse(topic.name, tuple(answers)))
        return OffsetForLeaderEpochResponse(tuple(topics))
