"""ListOffsets handler: a partition's earliest or latest offset, or the first at or after a time.

Earliest is the log start offset, the remote log's for a tiered log. A time lookup on a tiered log
whose remote segments hold records at or after the time is answered from them (by a remote reader
worker: the response then waits for it); otherwise from the local log. The replica manager makes
that choice (`ReplicaManager.offset_for_timestamp`); this handler turns its answers into the response.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import Future

from broker.handlers.slices import answer_in_slices
from broker.replica_manager import ReplicaManager
from common.errors import PymqError
from protocol import (
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    TopicRequest,
    TopicResponse,
    code_and_message,
)

Answer = ListOffsetsPartitionResponse | Future[ListOffsetsPartitionResponse]  # a remote lookup's answer comes later


class ListOffsetsHandler:
    """Loop-local. Latest is the high watermark: what a consumer can read. Synchronous unless a
    time lookup needs the remote tier or many partitions are answered in slices."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse | Awaitable[ListOffsetsResponse]:
        """Every partition's answer, many of them in slices (`answer_in_slices`)."""
        entries = [(topic, p) for topic in request.topics for p in topic.partitions]
        return answer_in_slices(entries, lambda entry: self._partition(*entry, request.isolation_level),
                                lambda answers: self._respond(request, answers))

    def _respond(self, request: ListOffsetsRequest, answers: list[Answer]) -> ListOffsetsResponse | Awaitable[ListOffsetsResponse]:
        if any(isinstance(answer, Future) for answer in answers):
            return self._after_remote_lookups(request, answers)
        return self._response(request, answers)  # type: ignore[arg-type]

    async def _after_remote_lookups(self, request: ListOffsetsRequest, answers: list[Answer]) -> ListOffsetsResponse:
        return self._response(request, [await asyncio.wrap_future(answer) if isinstance(answer, Future) else answer
                                         for answer in answers])

    @staticmethod
    def _response(request: ListOffsetsRequest, answers: list[ListOffsetsPartitionResponse]) -> ListOffsetsResponse:
        """The flat `answers`, in the order of the request's partitions, grouped by its topics."""
        topics, start = [], 0
        for topic in request.topics:
            end = start + len(topic.partitions)
            topics.append(TopicResponse(topic.name, tuple(answers[start:end])))
            start = end
        return ListOffsetsResponse(tuple(topics))

    def _partition(self, topic: TopicRequest[ListOffsetsPartition], p: ListOffsetsPartition,
                   isolation_level: int) -> ListOffsetsPartitionResponse | Future[ListOffsetsPartitionResponse]:
        malformed = topic.error or p.error
        if malformed is not None:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(malformed))
        try:
            found = self.replicas.offset_for_timestamp(topic.name, p.partition, p.timestamp, p.current_leader_epoch,
                                                       isolation_level)
        except PymqError as err:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(err))
        if not isinstance(found, Future):
            return ListOffsetsPartitionResponse(p.partition, offset=found[0], timestamp=found[1])
        answer: Future[ListOffsetsPartitionResponse] = Future()

        def looked_up(lookup: Future[tuple[int, int]]) -> None:
            try:
                offset, timestamp = lookup.result()
                answer.set_result(ListOffsetsPartitionResponse(p.partition, offset=offset, timestamp=timestamp))
            except PymqError as err:
                answer.set_result(ListOffsetsPartitionResponse(p.partition, *code_and_message(err)))
            except BaseException as err:
                answer.set_exception(err)

        found.add_done_callback(looked_up)
        return answer
