"""ListOffsets handler: a partition's earliest or latest offset, or the first at or after a time.

Earliest is the log start offset, the remote log's for a tiered log. A time lookup on a tiered log
whose remote segments hold records at or after the time is answered from them (by a remote reader
worker: the response then waits for it); otherwise from the local log.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import Future

from broker.handlers.fetch import LeaderLog
from broker.handlers.slices import answer_in_slices
from broker.log import UnifiedLog
from broker.replica_manager import ReplicaManager
from common.errors import InvalidRequestError, PymqError
from protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
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

    def __init__(self, leader_log: LeaderLog, replicas: ReplicaManager) -> None:
        self.leader_log = leader_log
        self.replicas = replicas

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse | Awaitable[ListOffsetsResponse]:
        """Every partition's answer, many of them in slices (`answer_in_slices`)."""
        entries = [(topic, p) for topic in request.topics for p in topic.partitions]
        return answer_in_slices(entries, lambda entry: self._partition(*entry),
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

    def _partition(self, topic: TopicRequest[ListOffsetsPartition],
                   p: ListOffsetsPartition) -> ListOffsetsPartitionResponse | Future[ListOffsetsPartitionResponse]:
        malformed = topic.error or p.error
        if malformed is not None:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(malformed))
        try:
            partition_log = self.leader_log(topic.name, p.partition, p.current_leader_epoch)
            if p.timestamp >= 0:
                lookup = self._remote_lookup(partition_log, p.partition, p.timestamp)
                if lookup is not None:
                    return lookup
            offset, timestamp = _offset_for(partition_log, p.timestamp)
        except PymqError as err:
            return ListOffsetsPartitionResponse(p.partition, *code_and_message(err))
        return ListOffsetsPartitionResponse(p.partition, offset=offset, timestamp=timestamp)

    def _remote_lookup(self, partition_log: UnifiedLog, partition: int,
                       timestamp: int) -> Future[ListOffsetsPartitionResponse] | None:
        """The remote tier's answer to come, if its segments may hold a record at or after
        `timestamp` (the manifest's max timestamps tell without a read); None: ask the local log."""
        remote = self.replicas.remote_logs
        if remote is None or not partition_log.tiered:
            return None
        manifest = remote.manifest(partition_log.topic, partition_log.partition)
        if manifest is None or not manifest.prune(partition_log.log_start_offset, None, timestamp, None):
            return None
        answer: Future[ListOffsetsPartitionResponse] = Future()

        def found(lookup: Future[tuple[int, int] | None]) -> None:
            try:
                hit = lookup.result()
                if hit is None:  # the manifest's max timestamp was a record below the log start
                    hit = _offset_for(partition_log, timestamp)
                answer.set_result(ListOffsetsPartitionResponse(partition, offset=hit[0], timestamp=hit[1]))
            except PymqError as err:
                answer.set_result(ListOffsetsPartitionResponse(partition, *code_and_message(err)))
            except BaseException as err:
                answer.set_exception(err)

        remote.reader.offset_for_timestamp(partition_log.topic, partition, manifest, timestamp).add_done_callback(found)
        return answer


def _offset_for(partition_log: UnifiedLog, timestamp: int) -> tuple[int, int]:
    if timestamp == LATEST_TIMESTAMP:
        return partition_log.high_watermark, -1
    if timestamp == EARLIEST_TIMESTAMP:
        return partition_log.log_start_offset, -1
    if timestamp < 0:  # ListOffsetsRequest.from_control refuses these: a caller that skipped it
        raise InvalidRequestError(f"ListOffsets timestamp {timestamp}: -1 (latest), -2 (earliest) or a time in ms >= 0")
    found = partition_log.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)
