"""TransactionCoordinator: transactional ids, their producer ids and epochs, and the state of their
transactions (Kafka's TransactionCoordinator and TransactionStateManager), a pure state machine on
the coordinator runtime over `__transaction_state` (docs/exactly-once.md).

A transactional id lives in one partition of `__transaction_state` (`partition_of`, hashed as group
ids are); the leader of that partition coordinates it. Its record (transaction_records.py) is its
whole state: every change is stored first (an `Append`) and applied when the append completes, so
a coordinator that fails over leaves its successor exactly what was acknowledged. While one
change of an id is being stored, other requests for it are answered CONCURRENT_TRANSACTIONS
(retriable), as Kafka's pending state does.

    InitProducerId   a new id: a producer id, epoch 0. A known one: the next epoch (fencing the
                     older instance), after aborting its open transaction: the caller is told
                     CONCURRENT_TRANSACTIONS while the abort's markers are written, and retries.
                     The producer's own bump (its id and epoch in the request, after an abort)
                     is recognised when retried: answered with the epoch it got.
    AddPartitionsToTxn / AddOffsetsToTxn   EMPTY/COMPLETE_* -> ONGOING (the transaction starts,
                     its timeout runs), partitions added.
    EndTxn prepare   ONGOING/EMPTY -> PREPARED (labelled): no timeout; waits for a decision.
    EndTxn           ONGOING/PREPARED -> PREPARE_COMMIT/PREPARE_ABORT, stored before the answer:
                     the decision is durable. Then the markers are written to every partition of
                     the transaction (the `WriteMarkers` effect, carried out by TxnMarkerWriter)
                     and, once all are, COMPLETE_COMMIT/COMPLETE_ABORT.
    timeout          an ONGOING transaction older than its timeout is aborted under the next epoch
                     (its producer is fenced: it must not add to a transaction already aborted).

A coordinator taking over a partition resumes the markers of every PREPARE_COMMIT/PREPARE_ABORT
it replays. Ids idle for transactional.id.expiration.ms in EMPTY or COMPLETE_* are deleted.
Loop-local, no I/O, no clock.
"""
from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.config import BrokerConfig
from broker.coordinator.group_records import partition_for
from broker.coordinator.results import Append, Result
from broker.coordinator.transaction_records import (
    TRANSACTION_STATE_TOPIC,
    TxnMetadata,
    TxnState,
    check_label,
    check_transactional_id,
)
from common.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    PymqError,
    UnknownTopicOrPartitionError,
)
from common.topic_partition import TopicPartition
from protocol.messages.base import PartitionResponse, TopicRequest, TopicResponse, code_and_message
from protocol.messages.transactions import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    DescribedTransaction,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
)

log = logging.getLogger("pymq.transaction_coordinator")

MAX_EPOCH = 32_766  # an int16, and Kafka keeps the last value free: past it, a new producer id


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """The broker configs the coordinator obeys (Kafka's names in `of`)."""

    state_partitions: int = 50
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 7 * 86_400_000
    max_partitions: int = 10_000

    @classmethod
    def of(cls, config: BrokerConfig) -> "TxnConfig":
        return cls(config["transaction.state.log.num.partitions"], config["transaction.max.timeout.ms"],
                   config["transactional.id.expiration.ms"], config["transaction.max.partitions"])


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    """An effect: write the commit or abort markers of a decided transaction to its partitions,
    then report `TransactionCoordinator.markers_written`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: frozenset[TopicPartition]
    state_partition: int  # of __transaction_state: its leader epoch is the coordinator epoch


class TransactionCoordinator:
    """The transactional ids of the `__transaction_state` partitions this broker leads. Loop-local."""

    def __init__(self, config: TxnConfig) -> None:
        self.config = config
        self.txns: dict[str, TxnMetadata] = {}
        self._partitions: dict[int, bool] = {}  # partition -> loaded (False while its records replay)
        self._loading: dict[int, dict[str, TxnMetadata | None]] = {}
        self._pending: set[str] = set()  # ids with a change being stored
        self._timers: list[tuple[int, str]] = []  # heap of (timeout deadline, id); stale entries skipped

    # -- partitions of __transaction_state ---------------------------------------------------------

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.state_partitions)

    def begin_load(self, partition: int) -> None:
        self._partitions[partition] = False
        self._loading[partition] = {}

    def replay(self, partition: int, key: str, value: TxnMetadata | None, producer_id: int) -> None:
        self._loading[partition][key] = value

    def replay_marker(self, partition: int, producer_id: int, committed: bool) -> None:
        """`__transaction_state` holds no transactional batches, so no marker: nothing to do."""

    def finish_load(self, partition: int, now_ms: int) -> Result:
        result = Result()
        for transactional_id, meta in self._loading.pop(partition).items():
            if meta is None:
                continue
            self.txns[transactional_id] = meta
            if meta.state.completing:  # decided before the failover: finish it
                result.effects.append(_markers(meta, self.partition_of(transactional_id)))
            self._schedule(meta)
        self._partitions[partition] = True
        log.info("loaded %d transactional ids of %s partition %d", sum(
            self.partition_of(t) == partition for t in self.txns), TRANSACTION_STATE_TOPIC, partition)
        return result

    def unload(self, partition: int) -> Result:
        self._partitions.pop(partition, None)
        self._loading.pop(partition, None)
        for transactional_id in [t for t in self.txns if self.partition_of(t) == partition]:
            del self.txns[transactional_id]
        return Result()

    def owns_partition(self, partition: int) -> bool:
        return self._partitions.get(partition) is True

    def _check(self, transactional_id: str) -> None:
        check_transactional_id(transactional_id)
        loaded = self._partitions.get(self.partition_of(transactional_id))
        if loaded is None:
            raise NotCoordinatorError(f"this broker does not coordinate transactional id {transactional_id!r}")
        if not loaded:
            raise CoordinatorLoadInProgressError(f"{TRANSACTION_STATE_TOPIC} partition "
                                                 f"{self.partition_of(transactional_id)} is still loading")
        if transactional_id in self._pending:
            raise ConcurrentTransactionsError(f"transactional id {transactional_id!r} has a change being stored")

    # -- requests ----------------------------------------------------------------------------------

    def init_producer_id(self, request: InitProducerIdRequest, token: Any, now_ms: int, fresh_id: int) -> Result:
        """`fresh_id`: a producer id from the allocator, used if the id needs one."""
        transactional_id = request.transactional_id
        assert transactional_id is not None, "an idempotent producer's InitProducerId is not the coordinator's"
        try:
            self._check(transactional_id)
            timeout = request.transaction_timeout_ms
            if not 0 < timeout <= self.config.max_timeout_ms:
                raise InvalidTransactionTimeoutError(
                    f"transaction.timeout.ms {timeout} is not within (0, {self.config.max_timeout_ms}] "
                    "(transaction.max.timeout.ms)")
            meta = self.txns.get(transactional_id)
            retry = meta is not None and self._check_reinit(meta, request)
        except PymqError as err:
            return Result.reply(token, InitProducerIdResponse(*code_and_message(err)))
        # The producer's own bump (after its abort) remembers the epoch it left, so that a retry
        # whose answer was lost gets this epoch, not PRODUCER_FENCED; a new instance's does not.
        last_epoch = request.producer_epoch if request.producer_id >= 0 else -1
        if meta is None:
            new = TxnMetadata(transactional_id, fresh_id, 0, timeout, update_ms=now_ms)
        elif retry:
            return Result.reply(token, InitProducerIdResponse(
                producer_id=meta.producer_id, producer_epoch=meta.producer_epoch, last_label=meta.last_label,
                last_committed=meta.last_committed))
        elif meta.state.open:
            # Fence the older instance and abort its transaction; the caller retries once the
            # markers are written (Kafka answers CONCURRENT_TRANSACTIONS too).
            log.info("transactional id %r: InitProducerId fences producer %d epoch %d and aborts its %s transaction",
                     transactional_id, meta.producer_id, meta.producer_epoch, meta.state.value)
            return self._decide(meta.but(producer_epoch=meta.producer_epoch + 1, last_epoch=last_epoch)
                                if meta.producer_epoch < MAX_EPOCH else meta, False, now_ms, token,
                                InitProducerIdResponse(*code_and_message(ConcurrentTransactionsError(
                                    f"the open transaction of {transactional_id!r} is being aborted: retry"))))
        elif meta.producer_epoch >= MAX_EPOCH:
            new = meta.but(producer_id=fresh_id, producer_epoch=0, timeout_ms=timeout, state=TxnState.EMPTY,
                           update_ms=now_ms, last_epoch=-1)
        else:
            new = meta.but(producer_epoch=meta.producer_epoch + 1, timeout_ms=timeout, state=TxnState.EMPTY,
                           partitions=frozenset(), start_ms=-1, update_ms=now_ms, label=None, last_epoch=last_epoch)
        answer = InitProducerIdResponse(producer_id=new.producer_id, producer_epoch=new.producer_epoch,
                                        last_label=new.last_label, last_committed=new.last_committed)
        return self._store(new, lambda err, now: Result.reply(
            token, answer if err is None else InitProducerIdResponse(*code_and_message(err))))

    @staticmethod
    def _check_reinit(meta: TxnMetadata, request: InitProducerIdRequest) -> bool:
        """Raise unless `request` may take the id's next epoch: CONCURRENT_TRANSACTIONS while its
        markers are written, PRODUCER_FENCED for an id and epoch that are neither the current
        ones nor a retry. Returns True for a retry of the producer's own bump that already
        happened (its epoch is the one that bump left, and no transaction began since): it is
        answered with the current epoch, unchanged."""
        if meta.state.completing:
            raise ConcurrentTransactionsError(f"the last transaction of {meta.transactional_id!r} is completing: retry")
        if request.producer_id < 0:
            return False  # a new instance: it fences whatever is there
        current = (request.producer_id, request.producer_epoch) == (meta.producer_id, meta.producer_epoch)
        retry = (request.producer_id == meta.producer_id and request.producer_epoch == meta.last_epoch >= 0
                 and not meta.state.open)
        if not (current or retry):
            raise ProducerFencedError(f"producer {request.producer_id} epoch {request.producer_epoch} is not the "
                                      f"current instance of {meta.transactional_id!r}")
        return retry

    def add_partitions(self, request: AddPartitionsToTxnRequest, token: Any, now_ms: int,
                       exists: Callable[[str, int], bool]) -> Result:
        wanted = [(t.name, p) for t in request.topics for p in t.partitions]

        def answer(err: PymqError | None, errors: dict[TopicPartition, PymqError] | None = None) -> Result:
            return Result.reply(token, AddPartitionsToTxnResponse(tuple(
                TopicResponse(t.name, tuple(PartitionResponse(p, *code_and_message((errors or {}).get((t.name, p), err)))
                                            for p in t.partitions)) for t in request.topics)))

        try:
            meta = self._producer_txn(request.transactional_id, request.producer_id, request.producer_epoch)
            missing = {tp: UnknownTopicOrPartitionError(f"{tp[0]}-{tp[1]} does not exist")
                       for tp in wanted if not exists(*tp)}
            if missing:
                return answer(InvalidRequestError("another partition of the request does not exist: none was added"),
                              missing)
        except PymqError as err:
            return answer(err)
        return self._add(meta, frozenset(wanted), now_ms, answer)

    def add_offsets(self, request: AddOffsetsToTxnRequest, token: Any, now_ms: int, offsets_partition: TopicPartition) -> Result:
        def answer(err: PymqError | None) -> Result:
            return Result.reply(token, AddOffsetsToTxnResponse(*code_and_message(err)))

        try:
            meta = self._producer_txn(request.transactional_id, request.producer_id, request.producer_epoch)
        except PymqError as err:
            return answer(err)
        return self._add(meta, frozenset([offsets_partition]), now_ms, answer)

    def _add(self, meta: TxnMetadata, partitions: frozenset[TopicPartition], now_ms: int,
             answer: Callable[[PymqError | None], Result]) -> Result:
        if meta.state == TxnState.PREPARED:
            return answer(InvalidTxnStateError(f"the transaction of {meta.transactional_id!r} is prepared: "
                                               "nothing may join it"))
        if meta.state == TxnState.ONGOING and partitions <= meta.partitions:
            return answer(None)
        added = (meta.partitions if meta.state == TxnState.ONGOING else frozenset()) | partitions
        if len(added) > self.config.max_partitions:
            return answer(InvalidRequestError(f"a transaction spans at most {self.config.max_partitions} partitions "
                                              "(transaction.max.partitions)"))
        new = meta.but(state=TxnState.ONGOING, partitions=added, update_ms=now_ms,
                       start_ms=meta.start_ms if meta.state == TxnState.ONGOING else now_ms, label=None)
        return self._store(new, lambda err, now: answer(err))

    def end_txn(self, request: EndTxnRequest, token: Any, now_ms: int) -> Result:
        def answer(err: PymqError | None) -> Result:
            return Result.reply(token, EndTxnResponse(*code_and_message(err)))

        try:
            check_label(request.label)
            meta = self._producer_txn(request.transactional_id, request.producer_id, request.producer_epoch)
            state, committed = meta.state, request.committed
            if request.prepare:
                if state == TxnState.PREPARED and meta.label == request.label:
                    return answer(None)  # a retry
                if state not in (TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                    raise InvalidTxnStateError(f"cannot prepare the transaction of {meta.transactional_id!r}: it is "
                                               f"{state.value}")
                new = meta.but(state=TxnState.PREPARED, update_ms=now_ms, label=request.label,
                               partitions=meta.partitions if state == TxnState.ONGOING else frozenset())
                return self._store(new, lambda err, now: answer(err))
            if state.open:
                return self._decide(meta, committed, now_ms, token, EndTxnResponse())
            if (state, committed) in ((TxnState.COMPLETE_COMMIT, True), (TxnState.COMPLETE_ABORT, False)):
                return answer(None)  # a retry of what completed
            if (state, committed) in ((TxnState.PREPARE_COMMIT, True), (TxnState.PREPARE_ABORT, False)):
                raise ConcurrentTransactionsError(f"the transaction of {meta.transactional_id!r} is completing")
            raise InvalidTxnStateError(f"cannot {'commit' if committed else 'abort'} the transaction of "
                                       f"{meta.transactional_id!r}: it is {state.value}")
        except PymqError as err:
            return answer(err)

    def _producer_txn(self, transactional_id: str, producer_id: int, producer_epoch: int) -> TxnMetadata:
        """The id's state, if (producer_id, producer_epoch) is its current producer."""
        self._check(transactional_id)
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise InvalidProducerIdMappingError(f"producer {producer_id} is not the producer of transactional id "
                                                f"{transactional_id!r}")
        if producer_epoch != meta.producer_epoch:
            raise ProducerFencedError(f"producer {producer_id} epoch {producer_epoch} of {transactional_id!r} was "
                                      f"fenced: the current epoch is {meta.producer_epoch}")
        if meta.state.completing:
            raise ConcurrentTransactionsError(f"the last transaction of {transactional_id!r} is completing")
        return meta

    def _decide(self, meta: TxnMetadata, committed: bool, now_ms: int, token: Any, answer: Any) -> Result:
        """Store PREPARE_COMMIT/PREPARE_ABORT, then answer and write the markers (or complete at
        once when the transaction touched no partition)."""
        decided = meta.but(state=TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT, update_ms=now_ms)
        partition = self.partition_of(meta.transactional_id)

        def stored(err: PymqError | None, now: int) -> Result:
            if err is not None:
                return Result.reply(token, type(answer)(*code_and_message(err)))
            result = Result.reply(token, answer)
            if decided.partitions:
                result.effects.append(_markers(decided, partition))
            else:
                result.add(self._complete(decided, now))
            return result

        return self._store(decided, stored)

    def markers_written(self, markers: WriteMarkers, now_ms: int) -> Result:
        """Every marker of a decided transaction is written: it is complete."""
        meta = self.txns.get(markers.transactional_id)
        if (meta is None or not meta.state.completing or markers.transactional_id in self._pending
                or (meta.producer_id, meta.producer_epoch) != (markers.producer_id, markers.producer_epoch)):
            return Result()  # no longer this coordinator's, or completed already
        return self._complete(meta, now_ms)

    def _complete(self, meta: TxnMetadata, now_ms: int) -> Result:
        committed = meta.state == TxnState.PREPARE_COMMIT
        done = meta.but(state=TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT,
                        partitions=frozenset(), start_ms=-1, update_ms=now_ms, label=None,
                        last_label=meta.label, last_committed=committed)
        return self._store(done, lambda err, now: Result())  # a failed store is resumed by the next coordinator

    def describe(self, request: DescribeTransactionsRequest) -> DescribeTransactionsResponse:
        described = []
        for transactional_id in request.transactional_ids:
            try:
                check_transactional_id(transactional_id)
                if self._partitions.get(self.partition_of(transactional_id)) is not True:
                    raise NotCoordinatorError(f"this broker does not coordinate {transactional_id!r}")
                meta = self.txns.get(transactional_id)
                if meta is None:
                    raise InvalidProducerIdMappingError(f"no transactional id {transactional_id!r}")
            except PymqError as err:
                described.append(DescribedTransaction(transactional_id, *code_and_message(err)))
                continue
            topics: dict[str, list[int]] = {}
            for topic, p in sorted(meta.partitions):
                topics.setdefault(topic, []).append(p)
            described.append(DescribedTransaction(
                transactional_id, state=meta.state.value, producer_id=meta.producer_id,
                producer_epoch=meta.producer_epoch, timeout_ms=meta.timeout_ms, start_ms=meta.start_ms,
                label=meta.label, topics=tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items())))
        return DescribeTransactionsResponse(tuple(described))

    # -- timers ------------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        while self._timers and not self._due_entry(*self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _due_entry(self, deadline: int, transactional_id: str) -> bool:
        meta = self.txns.get(transactional_id)
        return meta is not None and meta.state == TxnState.ONGOING and meta.start_ms + meta.timeout_ms == deadline

    def tick(self, now_ms: int) -> Result:
        """Abort every ONGOING transaction older than its timeout, under the next epoch."""
        result = Result()
        while (deadline := self.next_deadline()) is not None and deadline <= now_ms:
            _, transactional_id = heapq.heappop(self._timers)
            meta = self.txns[transactional_id]
            if transactional_id in self._pending:
                heapq.heappush(self._timers, (now_ms + 100, transactional_id))  # after the change in flight
                continue
            log.info("transactional id %r: the transaction of producer %d epoch %d timed out after %d ms: aborting it",
                     transactional_id, meta.producer_id, meta.producer_epoch, meta.timeout_ms)
            bumped = (meta.but(producer_epoch=meta.producer_epoch + 1, last_epoch=-1) if meta.producer_epoch < MAX_EPOCH
                      else meta)
            result.add(self._decide(bumped, False, now_ms, None, EndTxnResponse()))
        return result

    def expire_ids(self, now_ms: int) -> Result:
        """Delete ids idle in EMPTY or COMPLETE_* for transactional.id.expiration.ms (a tombstone each)."""
        result = Result()
        for transactional_id, meta in list(self.txns.items()):
            if (meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
                    and meta.update_ms + self.config.id_expiration_ms <= now_ms and transactional_id not in self._pending
                    and self._partitions.get(self.partition_of(transactional_id))):
                result.add(self._store_tombstone(meta))
        return result

    def _schedule(self, meta: TxnMetadata) -> None:
        if meta.state == TxnState.ONGOING:
            heapq.heappush(self._timers, (meta.start_ms + meta.timeout_ms, meta.transactional_id))

    # -- storing -----------------------------------------------------------------------------------

    def _store(self, new: TxnMetadata, then: Callable[[PymqError | None, int], Result]) -> Result:
        """Append `new`; once stored, it is the id's state and `then(None, now)` answers; on a failed
        append the state stays as it was and `then(error, now)` answers."""
        transactional_id = new.transactional_id
        partition = self.partition_of(transactional_id)
        self._pending.add(transactional_id)

        def complete(err: PymqError | None, now_ms: int) -> Result:
            self._pending.discard(transactional_id)
            if err is None and self._partitions.get(partition) is None:
                err = NotCoordinatorError(f"{TRANSACTION_STATE_TOPIC} partition {partition} moved while the change was stored")
            if err is None:
                self.txns[transactional_id] = new
                self._schedule(new)
            return then(err, now_ms)

        return Result(appends=[Append(partition, [(transactional_id, new)], complete)])

    def _store_tombstone(self, meta: TxnMetadata) -> Result:
        transactional_id = meta.transactional_id
        self._pending.add(transactional_id)

        def complete(err: PymqError | None, now_ms: int) -> Result:
            self._pending.discard(transactional_id)
            if err is None and self.txns.get(transactional_id) == meta:
                del self.txns[transactional_id]
            return Result()

        return Result(appends=[Append(self.partition_of(transactional_id), [(transactional_id, None)], complete)])


def _markers(meta: TxnMetadata, state_partition: int) -> WriteMarkers:
    return WriteMarkers(meta.transactional_id, meta.producer_id, meta.producer_epoch,
                        meta.state == TxnState.PREPARE_COMMIT, meta.partitions, state_partition)
