"""TxnMarkerWriter: writes a decided transaction's commit or abort markers to every partition it
touched (Kafka's TransactionMarkerChannelManager), then tells the coordinator.

The transaction coordinator asks for it as an effect (`WriteMarkers`) once PREPARE_COMMIT or
PREPARE_ABORT is stored. Each partition's marker goes to its current leader: this broker's own
partitions through `write_local` (the WriteTxnMarkers handler's code, without the round trip),
the others in one WriteTxnMarkers request per leader over the BrokerChannel. A partition that
fails (a leader moving, a broker down, whatever the error) is retried after a back-off with the
leader looked up again, for as long as it takes: the decision is stored, and every partition must
get its marker (read_committed readers wait for it at the last stable offset). Only a partition
the metadata no longer has (its topic deleted) needs none. The writer stops when this broker no longer coordinates the transaction (its
`__transaction_state` partition moved): the new coordinator replays PREPARE_* and writes the
markers again (a marker written twice is harmless). Loop-local.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker import background
from broker.cluster.broker_channel import BrokerChannel
from broker.cluster.topics import TopicRegistry
from broker.coordinator.transaction_coordinator import WriteMarkers
from broker.coordinator.transaction_records import TRANSACTION_STATE_TOPIC
from common.errors import PymqError
from common.topic_partition import TopicPartition
from protocol import TopicRequest, TxnMarker, TxnMarkerResult, WriteTxnMarkersRequest

log = logging.getLogger("pymq.txn_markers")

RETRY_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0


class TxnMarkerWriter:
    def __init__(self, broker_id: int, registry: TopicRegistry, channel: BrokerChannel,
                 write_local: Callable[[TxnMarker], Awaitable[TxnMarkerResult]],
                 coordinator_epoch: Callable[[int], int | None],
                 on_written: Callable[[WriteMarkers], None]) -> None:
        self.broker_id = broker_id
        self.registry = registry
        self.channel = channel
        self._write_local = write_local
        self._coordinator_epoch = coordinator_epoch  # leader epoch of a __transaction_state partition led here, else None
        self._on_written = on_written
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, job: WriteMarkers) -> None:
        task = asyncio.get_running_loop().create_task(self._write(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _write(self, job: WriteMarkers) -> None:
        remaining = set(job.partitions)
        backoff = RETRY_BACKOFF_S
        try:
            while remaining:
                epoch = self._coordinator_epoch(job.state_partition)
                if epoch is None:
                    log.info("transactional id %r: %s-%d moved; its new coordinator writes the markers",
                             job.transactional_id, TRANSACTION_STATE_TOPIC, job.state_partition)
                    return
                remaining -= await self._round(job, remaining, epoch)
                if remaining:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
            self._on_written(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            background.report("txn-markers")

    async def _round(self, job: WriteMarkers, partitions: set[TopicPartition], epoch: int) -> set[TopicPartition]:
        """One attempt at each partition, grouped by leader; returns those done."""
        by_leader: dict[int, list[TopicPartition]] = {}
        done: set[TopicPartition] = set()
        for tp in partitions:
            info = self.registry.topics.get(tp[0])
            if info is None or tp[1] >= info.partition_count:
                done.add(tp)  # the topic was deleted: nothing left to mark
                continue
            by_leader.setdefault(info.partitions[tp[1]].leader, []).append(tp)
        attempts = [self._send(leader, job, tps, epoch) for leader, tps in by_leader.items()]
        for written in await asyncio.gather(*attempts):
            done |= written
        return done

    async def _send(self, leader: int, job: WriteMarkers, partitions: list[TopicPartition], epoch: int) -> set[TopicPartition]:
        topics: dict[str, list[int]] = {}
        for topic, p in sorted(partitions):
            topics.setdefault(topic, []).append(p)
        marker = TxnMarker(job.producer_id, job.producer_epoch, job.committed, epoch,
                           tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items()))
        try:
            if leader == self.broker_id:
                result = await self._write_local(marker)
            else:
                response = await self.channel.send(leader, WriteTxnMarkersRequest((marker,)))
                result = response.markers[0]
        except (PymqError, OSError, IndexError) as err:
            log.info("transaction markers of %r to broker %d: %s (retrying)", job.transactional_id, leader, err)
            return set()
        written = set()
        for topic in result.topics:
            for p in topic.partitions:
                err = p.error()
                if err is None:
                    written.add((topic.name, p.partition))
                else:
                    log.info("transaction marker of %r on %s-%d: %s (retrying)", job.transactional_id, topic.name,
                             p.partition, err.name())
        return written
