"""Producer ids and transactions: InitProducerId, FindCoordinator for transactional ids,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions (answered by the
`TransactionCoordinator` on the coordinator runtime over `__transaction_state`), and
WriteTxnMarkers (a partition leader writing markers for a coordinator).

An idempotent producer's InitProducerId is answered by any broker: a fresh id from the cluster's
allocator (broker/coordinator/producer_ids.py), epoch 0. A producer that must start its sequences
again sends its current id and gets a new one rather than the next epoch of the old: nothing
proves the old id is the caller's, and a fresh id cannot fence anyone else's producer.

`__transaction_state` is created on first use (FindCoordinator), as `__consumer_offsets` is.
Markers: the coordinator's `WriteMarkers` effects go to the TxnMarkerWriter; a partition leader
appends each marker with acks=all, then tells the `marker_listeners` (the group coordinator makes
a transaction's offsets visible, or drops them, when its marker lands in `__consumer_offsets`).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.broker_channel import BrokerChannel
from broker.cluster.broker_identity import BrokerIdentity, Session
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from broker.coordinator.group_records import OFFSETS_TOPIC
from broker.coordinator.producer_ids import ProducerIdManager
from broker.coordinator.runtime import APPEND_TIMEOUT_MS, CoordinatorRuntime
from broker.coordinator.transaction_coordinator import TransactionCoordinator, TxnConfig, WriteMarkers
from broker.coordinator.transaction_records import TRANSACTION_STATE_TOPIC, TxnMetadata, TxnRecordSerde, check_transactional_id
from broker.coordinator.txn_marker_writer import TxnMarkerWriter
from broker.handlers.internal_topic import InternalTopic
from broker.log import AppendInfo
from broker.replica_manager import ReplicaManager
from common.errors import CoordinatorNotAvailableError, PymqError
from protocol import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    Message,
    PartitionResponse,
    TopicResponse,
    TxnMarker,
    TxnMarkerResult,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
    code_and_message,
)

log = logging.getLogger("pymq.transactions")

# Called after a marker is stored on a partition led here: (topic, partition, producer_id, committed).
MarkerListener = Callable[[str, int, int, bool], None]


class TransactionHandler:
    """Loop-local. `runtime` is started and stopped by the server (RequestHandlers.coordinators);
    `close` stops the marker writer and the inter-broker connections."""

    def __init__(self, config: BrokerConfig, registry: TopicRegistry, replicas: ReplicaManager,
                 producer_ids: ProducerIdManager, create_topic: Any, advertised: Callable[[], tuple[str, int]],
                 address_of: Callable[[int], tuple[str, int] | None], identity: BrokerIdentity,
                 channel: BrokerChannel, group_partition: Callable[[str], int],
                 ensure_offsets_topic: Callable[[], Awaitable[None]]) -> None:
        self.broker_id: int = config["broker.id"]
        self.registry = registry
        self.replicas = replicas
        self.producer_ids = producer_ids
        self.advertised = advertised
        self.address_of = address_of
        self.identity = identity
        self.group_partition = group_partition  # group id -> its partition of __consumer_offsets
        self.ensure_offsets_topic = ensure_offsets_topic
        self.coordinator = TransactionCoordinator(TxnConfig.of(config))
        self.writer = TxnMarkerWriter(self.broker_id, registry, channel, self.write_local_marker,
                                      self._coordinator_epoch, self._markers_written)
        self.runtime: CoordinatorRuntime[str, TxnMetadata | None] = CoordinatorRuntime(
            "transaction", TRANSACTION_STATE_TOPIC, self.coordinator, TxnRecordSerde(), replicas,
            replicas.executors.group_load, on_effect=self.writer.submit)
        self.runtime.every("transactional-id-expiry",
                           config["transaction.remove.expired.transaction.cleanup.interval.ms"] / 1000,
                           self.coordinator.expire_ids)
        self.state_topic = InternalTopic(
            TRANSACTION_STATE_TOPIC, registry, create_topic, config["transaction.state.log.num.partitions"],
            {"cleanup.policy": "compact", "segment.bytes": config["transaction.state.log.segment.bytes"]},
            "transaction.state.log.replication.factor", self.runtime.loaded)
        self.marker_listeners: list[MarkerListener] = []

    async def close(self) -> None:
        await self.writer.close()
        self.writer.channel.close()

    # -- producer ids ------------------------------------------------------------------------------

    async def init_producer_id(self, request: InitProducerIdRequest) -> Message:
        try:
            fresh_id = await self.producer_ids.next_id()
        except PymqError as err:
            return InitProducerIdResponse(*code_and_message(err))
        if request.transactional_id is None:
            return InitProducerIdResponse(producer_id=fresh_id, producer_epoch=0)
        answer = self.runtime.call(lambda token, now: self.coordinator.init_producer_id(request, token, now, fresh_id))
        return answer if isinstance(answer, Message) else await answer

    async def find_coordinator(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
        try:
            check_transactional_id(request.key)
            await self.state_topic.ensure()
            partition = self.coordinator.partition_of(request.key)
            leader = self.registry.get(TRANSACTION_STATE_TOPIC).partitions[partition].leader
            address = self.advertised() if leader == self.broker_id else self.address_of(leader)
            if address is None:
                raise CoordinatorNotAvailableError(f"{TRANSACTION_STATE_TOPIC}-{partition} has no live leader (broker {leader})")
        except PymqError as err:
            return FindCoordinatorResponse(*code_and_message(err))
        host, port = address
        return FindCoordinatorResponse(node_id=leader, host=host, port=port)

    # -- transactions ------------------------------------------------------------------------------

    def add_partitions_to_txn(self, request: AddPartitionsToTxnRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.add_partitions(request, token, now, self._exists))

    async def add_offsets_to_txn(self, request: AddOffsetsToTxnRequest) -> Message:
        await self.ensure_offsets_topic()  # the group's partition must exist to get a marker
        offsets_partition = (OFFSETS_TOPIC, self.group_partition(request.group_id))
        answer = self.runtime.call(
            lambda token, now: self.coordinator.add_offsets(request, token, now, offsets_partition))
        return answer if isinstance(answer, Message) else await answer

    def end_txn(self, request: EndTxnRequest) -> Message | Awaitable[Message]:
        return self.runtime.call(lambda token, now: self.coordinator.end_txn(request, token, now))

    def describe_transactions(self, request: DescribeTransactionsRequest) -> DescribeTransactionsResponse:
        return self.coordinator.describe(request)

    def _exists(self, topic: str, partition: int) -> bool:
        info = self.registry.topics.get(topic)
        return info is not None and 0 <= partition < info.partition_count

    # -- markers -----------------------------------------------------------------------------------

    async def write_txn_markers(self, request: WriteTxnMarkersRequest, session: Session) -> WriteTxnMarkersResponse:
        self.identity.authorize_broker(session, "WriteTxnMarkers")
        return WriteTxnMarkersResponse(tuple([await self.write_local_marker(m) for m in request.markers]))

    async def write_local_marker(self, marker: TxnMarker) -> TxnMarkerResult:
        """Append `marker` to each of its partitions (led here, else that partition's error)."""
        pending: list[tuple[str, int, AppendInfo | Awaitable[AppendInfo] | PymqError]] = []
        for topic in marker.topics:
            for p in topic.partitions:
                try:
                    outcome: Any = self.replicas.append_marker(topic.name, p, marker.producer_id, marker.producer_epoch,
                                                               marker.committed, marker.coordinator_epoch, APPEND_TIMEOUT_MS)
                except PymqError as err:
                    outcome = err
                pending.append((topic.name, p, outcome))
        answers: dict[str, list[PartitionResponse]] = {}
        for topic_name, p, outcome in pending:
            if not isinstance(outcome, (AppendInfo, PymqError)):
                try:
                    outcome = await outcome
                except PymqError as err:
                    outcome = err
            err = outcome if isinstance(outcome, PymqError) else None
            if err is None:
                for listener in self.marker_listeners:
                    listener(topic_name, p, marker.producer_id, marker.committed)
            answers.setdefault(topic_name, []).append(PartitionResponse(p, *code_and_message(err)))
        return TxnMarkerResult(marker.producer_id, tuple(TopicResponse(t, tuple(ps)) for t, ps in answers.items()))

    def _coordinator_epoch(self, state_partition: int) -> int | None:
        """The leader epoch of a `__transaction_state` partition this broker leads (the epoch its
        markers carry), or None when it does not lead it any more."""
        try:
            target = self.replicas.partition(TRANSACTION_STATE_TOPIC, state_partition)
        except PymqError:
            return None
        return target.leader_epoch if target.is_leader and self.coordinator.owns_partition(state_partition) else None

    def _markers_written(self, job: WriteMarkers) -> None:
        self.runtime.apply(self.coordinator.markers_written(job, self.runtime.clock()))
