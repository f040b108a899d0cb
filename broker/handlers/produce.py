"""Produce handler: append each partition's record set through the ReplicaManager.

A partition's append is acknowledged at once (an AppendInfo), or later (an awaitable) when it was
queued on the log writer or its acknowledgement waits for a flush or the high watermark; the
response then waits for every partition of the request. acks=0 gets no response at all.
A malformed entry, or an append the replica manager refuses, is that partition's error only:
nothing is written for it, and the request's other partitions go on.
"""
from __future__ import annotations

from collections.abc import Awaitable
from typing import Union

from broker.cluster.topics import INTERNAL_TOPICS
from broker.log import AppendInfo
from broker.replica_manager import ReplicaManager
from broker.request_metrics import TopicTraffic
from common.errors import InvalidTopicError, PymqError
from protocol import (
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    TopicRequest,
    TopicResponse,
    code_and_message,
)

Outcome = Union[ProducePartitionResponse, Awaitable[ProducePartitionResponse]]


def _appended(partition: int, info: AppendInfo) -> ProducePartitionResponse:
    return ProducePartitionResponse(partition, 0, None, info.first_offset, info.log_append_time_ms, info.log_start_offset,
                                    info.batch_offsets)


def _failed(partition: int, err: PymqError) -> ProducePartitionResponse:
    return ProducePartitionResponse(partition, *code_and_message(err))


class ProduceHandler:
    """Loop-local and synchronous unless an append must wait: pipelined produces on a connection
    append in arrival order because each append starts before the handler returns."""

    def __init__(self, replicas: ReplicaManager, traffic: TopicTraffic) -> None:
        self.replicas = replicas
        self.traffic = traffic

    def produce(self, request: ProduceRequest) -> ProduceResponse | None | Awaitable[ProduceResponse | None]:
        outcomes = [(topic, [self._append(topic, p, request) for p in topic.partitions]) for topic in request.topics]
        if any(not isinstance(o, ProducePartitionResponse) for _, parts in outcomes for o in parts):
            return self._produced_later(request.acks, outcomes)
        return _response(request.acks, outcomes)  # type: ignore[arg-type]

    def _append(self, topic: TopicRequest[ProducePartition], p: ProducePartition, request: ProduceRequest) -> Outcome:
        """A partition's produce outcome, or an awaitable of it if it must wait."""
        malformed = topic.error or p.error
        if malformed is not None:
            return _failed(p.partition, malformed)
        if topic.name in INTERNAL_TOPICS:
            return _failed(p.partition, InvalidTopicError(f"{topic.name} is internal: only the broker writes to it"))
        records = p.record_set()
        try:
            appended = self.replicas.append(topic.name, p.partition, records, request.acks, request.timeout_ms,
                                            current_leader_epoch=p.current_leader_epoch)
        except PymqError as err:
            return _failed(p.partition, err)
        if isinstance(appended, AppendInfo):
            self.traffic.appended(topic.name, len(records), appended.record_count)
            return _appended(p.partition, appended)
        return self._append_later(topic.name, p.partition, len(records), appended)

    async def _append_later(self, topic: str, partition: int, size: int,
                            pending: Awaitable[AppendInfo]) -> ProducePartitionResponse:
        try:
            info = await pending
        except PymqError as err:
            return _failed(partition, err)
        self.traffic.appended(topic, size, info.record_count)
        return _appended(partition, info)

    @staticmethod
    async def _produced_later(acks: int, outcomes: list[tuple[TopicRequest[ProducePartition], list[Outcome]]]) -> ProduceResponse | None:
        """The response to a produce some of whose appends were queued or wait for their ack."""
        done = [(topic, [o if isinstance(o, ProducePartitionResponse) else await o for o in parts])
                for topic, parts in outcomes]
        return _response(acks, done)


def _response(acks: int, outcomes: list[tuple[TopicRequest[ProducePartition], list[ProducePartitionResponse]]]) -> ProduceResponse | None:
    if acks == 0:
        return None
    return ProduceResponse(tuple(TopicResponse(topic.name, tuple(parts)) for topic, parts in outcomes))
