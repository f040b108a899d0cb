"""Read a bounded offset range of one partition: what a Spark task (or a notebook) does.

Unlike the `Consumer`, which tails partitions with prefetching and long polls, a range read knows
where it stops: each Fetch asks for the next bytes from the current position without waiting
(the range is below the high watermark when it was planned), and next to no byte past the
range's last batch is requested. A Fetch cannot name an end offset, so each asks for what the
rest of the range needs at the bytes per offset seen so far (at most `max_bytes`); the first asks
for one byte, which the broker answers with exactly the first batch (KIP-74: the first batch
comes whole whatever the limit). Asking for `max_bytes` every time would read up to 8 MiB past
the end of every small range, and a pushed-down `offset < n` would save no I/O. Batches come back
decoded (zero-copy Arrow bodies) and trimmed to [start, end); turning them into rows of any
schema is the caller's (Arrow kernels, no per-record Python).

Offsets the range wants that retention has deleted are data loss: `DataLossError` names topic,
partition and the lost offsets, or, with `fail_on_data_loss=False`, the read skips to the log
start and reports how many offsets it skipped in `lost`.

With `topic_id` (the incarnation the range was planned on, KIP-516), every Fetch names it, and
the broker answers INCONSISTENT_TOPIC_ID (`InconsistentTopicIdError`, raised at once) when the
topic was deleted and re-created since: the new topic's records at the old offsets are never
read, however quickly the re-creation happened. Errors are retried by the consumer's policy
(`client.retry`: the error class decides; back-off, refresh metadata, try the leader it names)
for up to `retry_timeout_s` without progress: a time bound, the same however fast the failures
come. A peer that is not a pymq broker fails the read at once (NotAPymqBrokerError).
"""
from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

import protocol
from client.cluster import Cluster
from client.decoder import AbortedFilter, FetchedBatch, decode_fetched
from client.offset_fetcher import list_offsets
from client.retry import Retry, retriable
from common.errors import DataLossError, OffsetOutOfRangeError, PymqError, RequestTimedOutError
from protocol import READ_UNCOMMITTED, FetchPartition, FetchRequest, TopicRequest

log = logging.getLogger("pymq.range_reader")

SIZE_MARGIN = 1.1  # fetch a little more than the estimate: records vary in size


@dataclass
class RangeStats:
    """What a range read cost and skipped: tests and benchmarks check pushdown with it."""

    fetches: int = 0
    bytes_fetched: int = 0
    records: int = 0
    lost: int = 0  # offsets skipped because retention had deleted them (fail_on_data_loss=False)


async def read_range(cluster: Cluster, topic: str, partition: int, start: int, end: int, *,
                     max_bytes: int = 8 << 20, fail_on_data_loss: bool = True, check_crcs: bool = True,
                     retry_backoff_s: float = 0.1, retry_timeout_s: float = 120.0, topic_id: str | None = None,
                     stats: RangeStats | None = None,
                     isolation_level: int = READ_UNCOMMITTED) -> AsyncIterator[list[FetchedBatch]]:
    """The records of `topic`-`partition` with offsets in [start, end), in order: the batches
    of one fetch at a time (a caller may join them into one Arrow batch).

    Raises DataLossError for offsets that are gone (see the module docstring),
    InconsistentTopicIdError when the topic is not the incarnation `topic_id` any more,
    CorruptRecordError for a batch that fails its checks, the last retriable error when
    `retry_timeout_s` passed without progress, and the broker's error for anything not
    retriable."""
    stats = stats if stats is not None else RangeStats()
    position = start
    retry = _RangeRetry(cluster, topic, partition, retry_backoff_s, retry_timeout_s)
    seen_bytes = seen_offsets = 0  # what fetches so far returned and how far they moved
    while position < end:
        size = 1 if not seen_offsets else min(max_bytes, math.ceil((end - position) * seen_bytes / seen_offsets
                                                                   * SIZE_MARGIN))
        try:
            leader = await cluster.leader(topic, partition)
            request = FetchRequest((TopicRequest(topic, (FetchPartition(partition, position, size),), topic_id),),
                                   max_wait_ms=0, min_bytes=0, max_bytes=size, isolation_level=isolation_level)
            reply = await cluster.send(leader, request)
            answer = reply.topics[0].partitions[0]
            err = answer.error()
            if err is not None:
                raise err
        except OffsetOutOfRangeError:
            position = await _lost(cluster, topic, partition, position, end, fail_on_data_loss, stats)
            continue
        except PymqError as err:
            if not retriable(err):
                raise
            await retry.after(err)
            continue
        data = answer.records
        stats.fetches += 1
        stats.bytes_fetched += len(data)
        moved = False
        fetched_from = position
        chunk = []
        aborted = None if isolation_level == READ_UNCOMMITTED else AbortedFilter(
            (a.producer_id, a.first_offset) for a in answer.aborted_transactions or ())
        decoded = decode_fetched((topic, partition), data, position, answer.high_watermark, check_crcs, aborted)
        for batch, _ in decoded.batches:
            if batch.first_offset >= end:
                position = end
                break
            moved = True
            last = batch.next_offset >= end
            if batch.next_offset > end:
                batch = batch.split(_rows_before(batch, end))[0]
            if batch.num_rows:
                stats.records += batch.num_rows
                chunk.append(batch)
            position = end if last else batch.next_offset
            if last:
                break
        seen_bytes += len(data)
        seen_offsets += position - fetched_from
        if chunk:
            yield chunk
        if decoded.corrupt is not None and position < end:
            raise decoded.corrupt  # a batch the range needs failed its checks
        if moved:
            retry.reset()
        elif position < end:
            if answer.log_start_offset > position:  # deleted between the fetch's start and now
                position = await _lost(cluster, topic, partition, position, end, fail_on_data_loss, stats)
            elif answer.high_watermark <= position:
                # Retried first: a new leader's high watermark can lag the old one's for a moment.
                gone = DataLossError(f"{topic}-{partition}: offsets {position}..{end - 1} are not in the log any more "
                                     f"(its end is {answer.high_watermark}: truncated?)", topic, partition, position, end)
                await retry.after(gone)
            else:
                # Nothing yet: the broker's remote read (tiered storage) outlasted its
                # remote.fetch.max.wait.ms and the answer came back empty, as Kafka's does. The
                # read goes on in the broker, which keeps its result for the next fetch: fetch again.
                await retry.after(RequestTimedOutError(
                    f"{topic}-{partition}: fetches at {position} returned no batch below the high watermark "
                    f"{answer.high_watermark} (a remote read that does not finish?)"))


def _rows_before(batch: FetchedBatch, end: int) -> int:
    if batch.offsets is None:
        return end - batch.first_offset
    return int(np.searchsorted(batch.offsets.to_numpy(), end))


async def _lost(cluster: Cluster, topic: str, partition: int, position: int, end: int,
                fail_on_data_loss: bool, stats: RangeStats) -> int:
    """`position` is below the log start: raise, or return where reading goes on."""
    found = await list_offsets(cluster, {(topic, partition): protocol.EARLIEST_TIMESTAMP})
    log_start = found[(topic, partition)][0]
    if log_start <= position:
        raise DataLossError(f"{topic}-{partition}: offset {position} is out of range but the log starts at "
                            f"{log_start}", topic, partition, position, end)
    gone_to = min(log_start, end)
    message = (f"{topic}-{partition}: offsets {position}..{gone_to - 1} were deleted (retention) before they "
               f"were read; the log now starts at {log_start}")
    if fail_on_data_loss:
        raise DataLossError(message + " (failOnDataLoss=true; set it to false to skip them)",
                            topic, partition, position, gone_to)
    log.warning("%s; skipping %d offsets (failOnDataLoss=false)", message, gone_to - position)
    stats.lost += gone_to - position
    return gone_to


class _RangeRetry(Retry):
    """The read's retries (`client.retry.Retry`, bounded by `timeout_s`), each after a refresh
    of the topic's metadata."""

    def __init__(self, cluster: Cluster, topic: str, partition: int, backoff_s: float, timeout_s: float) -> None:
        super().__init__(backoff_s, timeout_s)
        self.cluster, self.topic, self.partition = cluster, topic, partition

    async def after(self, err: PymqError) -> None:
        """Wait and refresh metadata before the next attempt, or raise `err` when time is up."""
        log.info("%s-%d: fetch failed (%s); retrying", self.topic, self.partition, err)
        await self.back_off(err)
        try:
            await self.cluster.refresh([self.topic])
        except PymqError as refresh_err:
            log.info("metadata refresh failed: %s", refresh_err)
