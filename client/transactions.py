"""The transactional producer's client side (the transactional half of Kafka's TransactionManager):
the transaction's state, its partitions, and the requests to its transaction coordinator.

    init_transactions()      FindCoordinator(transactional id) and InitProducerId: this producer's id
                             and epoch, fencing every older instance with the id (whose open
                             transaction the coordinator aborts)
    begin_transaction()      local: sends are allowed
    send ...                 each partition joins the transaction (AddPartitionsToTxn) before its
                             first batch goes out: its batches wait meanwhile (ProducerSequences)
    send_offsets_to_transaction(offsets, group)   AddOffsetsToTxn, then TxnOffsetCommit to the
                             group's coordinator: committed with the transaction's records
    commit_transaction()     every batch acknowledged, then EndTxn(commit): once it answers the
                             decision is stored and the coordinator writes the markers
    abort_transaction()      unsent batches fail, EndTxn(abort), then a new epoch (InitProducerId
                             again: sequences start over, so nothing of the aborted one can collide)
    prepare_transaction(label)  every batch acknowledged, then EndTxn(prepare): the transaction
                             waits, durable, for another client's commit or abort naming
                             (transactional id, producer id, epoch) (`PreparedTransaction`)

A failure inside a transaction (a batch that failed for good, a partition that could not join)
makes it abortable: sends and commit raise it until `abort_transaction`. PRODUCER_FENCED (a newer
instance started) is fatal: only `close` is left. Coordinator errors (NOT_COORDINATOR, loading,
unavailable) and CONCURRENT_TRANSACTIONS are retried (`CoordinatorLink`) until
`transaction_timeout_ms`. Everything but `check_can_send` runs on the producer's loop.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from client.cluster import Cluster
from client.group_membership import GroupMetadata
from client.idempotence import ProducerSequences
from common.errors import (
    BrokerNotAvailableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    NetworkError,
    NotCoordinatorError,
    ProducerFencedError,
    PymqError,
    RequestTimedOutError,
    TransactionAbortedError,
)
from common.topic_partition import TopicPartition
from protocol import (
    TRANSACTION_KEY_TYPE,
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    FindCoordinatorRequest,
    InitProducerIdRequest,
    OffsetCommitPartition,
    RequestMessage,
    TopicRequest,
    TxnOffsetCommitRequest,
)

log = logging.getLogger("pymq.producer")

R = TypeVar("R")

# Answers that finding the coordinator again, or waiting a moment, may cure.
RETRIED = (NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError,
           ConcurrentTransactionsError, NetworkError, RequestTimedOutError, BrokerNotAvailableError)
FATAL = (ProducerFencedError, InvalidProducerEpochError)
# CONCURRENT_TRANSACTIONS means the id's last transaction is having its markers written, which
# takes milliseconds: retried sooner than a coordinator that moved (Kafka's producer retries it
# after 20 ms too).
CONCURRENT_BACKOFF_S = 0.02


class TxnPhase(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"
    ABORTABLE = "abortable error"
    FATAL = "fatal error"


class PreparedTransaction(NamedTuple):
    """A prepared transaction, as the client that decides its outcome names it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class PreviousTransaction(NamedTuple):
    """How the transactional id's last transaction ended, as init_transactions found it: its
    label (two-phase commit) and whether it committed (None: no transaction yet)."""

    label: str | None
    committed: bool | None


class CoordinatorLink:
    """Requests to the coordinator of one key (a transactional id, or a group for TxnOffsetCommit),
    found with FindCoordinator and found again when it moves."""

    def __init__(self, cluster: Cluster, key: str, key_type: int, retry_backoff_s: float) -> None:
        self.cluster = cluster
        self.key, self.key_type = key, key_type
        self.retry_backoff_s = retry_backoff_s
        self._node: int | None = None

    async def send(self, make: Callable[[], RequestMessage[R]], timeout_s: float,
                   outcome: Callable[[R], PymqError | None] = lambda r: r.error()) -> R:  # type: ignore[attr-defined]
        """The response to `make()`, once `outcome(response)` names no retried error; retried
        errors until `timeout_s` passes (then the last one), other errors raised at once."""
        deadline = time.monotonic() + timeout_s
        backoff = self.retry_backoff_s
        while True:
            try:
                node = self._node if self._node is not None else await self._find()
                response = await self.cluster.send(node, make())
                err = outcome(response)
                if err is None:
                    return response
                raise err
            except RETRIED as err:
                concurrent = isinstance(err, ConcurrentTransactionsError)
                if not concurrent:
                    self._node = None
                wait = min(backoff, CONCURRENT_BACKOFF_S) if concurrent else backoff
                if time.monotonic() + wait >= deadline:
                    raise
                log.debug("coordinator of %r: %s; retrying", self.key, err.name())
            await asyncio.sleep(wait)
            backoff = min(backoff * 2, 1.0)

    async def _find(self) -> int:
        found = await self.cluster.send(None, FindCoordinatorRequest(self.key, self.key_type))
        err = found.error()
        if err is not None:
            raise err
        self._node = found.node_id
        return found.node_id


class TransactionManager:
    """One transactional producer's transactions (see the module docstring). `sequences` are the
    producer's (their identity is installed from here, never renewed on their own);
    `flush()` waits for every batch sent so far; `fail_paused(err)` fails the batches waiting for
    their partitions to join."""

    def __init__(self, cluster: Cluster, sequences: ProducerSequences, transactional_id: str, timeout_ms: int,
                 retry_backoff_s: float, flush: Callable[[], Any], fail_paused: Callable[[PymqError], None]) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.sequences = sequences
        self.cluster = cluster
        self.link = CoordinatorLink(cluster, transactional_id, TRANSACTION_KEY_TYPE, retry_backoff_s)
        self.retry_backoff_s = retry_backoff_s
        self._flush = flush
        self._fail_paused = fail_paused
        self.phase = TxnPhase.UNINITIALIZED
        self.error: PymqError | None = None  # why the transaction is abortable, or the producer fatal
        self._touched = False  # this transaction asked the coordinator to add a partition (it may be open there)
        self._adding: asyncio.Future[None] | None = None  # an AddPartitionsToTxn in flight
        self._offsets_added: set[str] = set()  # groups whose offsets partition joined this transaction

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    # -- checks from any thread --------------------------------------------------------------------

    def check_can_send(self) -> None:
        """Raise unless a transaction is open (send() calls it)."""
        if self.phase is not TxnPhase.IN_TRANSACTION:
            raise self._state_error("send")

    def _state_error(self, action: str) -> PymqError:
        if self.phase in (TxnPhase.ABORTABLE, TxnPhase.FATAL) and self.error is not None:
            return self.error
        return InvalidTxnStateError(f"cannot {action}: the transactional producer {self.transactional_id!r} is "
                                    f"{self.phase.value}" + (" (call init_transactions first)"
                                                             if self.phase is TxnPhase.UNINITIALIZED else ""))

    def _require(self, action: str, *phases: TxnPhase) -> None:
        if self.phase not in phases:
            raise self._state_error(action)

    # -- transitions ---------------------------------------------------------------------------------

    async def init_transactions(self) -> PreviousTransaction:
        self._require("init_transactions", TxnPhase.UNINITIALIZED)
        response = await self._init_producer_id(-1, -1)
        self.phase = TxnPhase.READY
        log.info("transactional id %r: producer %d epoch %d", self.transactional_id, response.producer_id,
                 response.producer_epoch)
        return PreviousTransaction(response.last_label, response.last_committed)

    async def _init_producer_id(self, producer_id: int, epoch: int) -> Any:
        response = await self.link.send(lambda: InitProducerIdRequest(
            self.transactional_id, self.timeout_ms, producer_id, epoch), self.timeout_s)
        self.sequences.install(response.producer_id, response.producer_epoch, [])
        return response

    def begin_transaction(self) -> None:
        self._require("begin_transaction", TxnPhase.READY)
        self.sequences.added.clear()
        self._offsets_added.clear()
        self._touched = False
        self.phase = TxnPhase.IN_TRANSACTION

    def abortable(self, err: PymqError) -> None:
        """A failure inside the transaction (the sender reports batches that failed for good)."""
        if isinstance(err, FATAL):
            self.phase, self.error = TxnPhase.FATAL, err
        elif self.phase is TxnPhase.IN_TRANSACTION:
            self.phase, self.error = TxnPhase.ABORTABLE, err

    async def add_pending_partitions(self, on_added: Callable[[], None]) -> None:
        """Make the partitions batches wait for join the transaction (one AddPartitionsToTxn at a
        time); `on_added` queues their batches. A refusal makes the transaction abortable."""
        self._adding = asyncio.get_running_loop().create_future()
        try:
            await self._add_pending(on_added)
        finally:
            self._adding.set_result(None)
            self._adding = None

    async def _add_pending(self, on_added: Callable[[], None]) -> None:
        sequences = self.sequences
        while sequences.to_add:
            wanted = sorted(sequences.to_add)
            topics: dict[str, list[int]] = {}
            for topic, p in wanted:
                topics.setdefault(topic, []).append(p)
            request = AddPartitionsToTxnRequest(self.transactional_id, sequences.producer_id, sequences.epoch,
                                                tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items()))
            self._touched = True
            try:
                await self.link.send(lambda: request, self.timeout_s, _first_partition_error)
            except PymqError as err:
                log.info("transactional id %r: partitions could not join the transaction: %s", self.transactional_id, err)
                self.abortable(err)
                sequences.to_add.clear()
                self._fail_paused(err)
                return
            sequences.to_add.difference_update(wanted)
            sequences.added.update(wanted)
            on_added()

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group: str | GroupMetadata) -> None:
        self._require("send_offsets_to_transaction", TxnPhase.IN_TRANSACTION)
        metadata = group if isinstance(group, GroupMetadata) else GroupMetadata(group, -1, "", None)
        sequences = self.sequences
        try:
            if metadata.group_id not in self._offsets_added:
                self._touched = True
                await self.link.send(lambda: AddOffsetsToTxnRequest(
                    self.transactional_id, sequences.producer_id, sequences.epoch, metadata.group_id), self.timeout_s)
                self._offsets_added.add(metadata.group_id)
            topics: dict[str, list[OffsetCommitPartition]] = {}
            for (topic, partition), offset in sorted(offsets.items()):
                topics.setdefault(topic, []).append(OffsetCommitPartition(partition, offset))
            request = TxnOffsetCommitRequest(
                self.transactional_id, metadata.group_id, sequences.producer_id, sequences.epoch,
                tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items()), metadata.generation_id,
                metadata.member_id, metadata.group_instance_id)
            group_link = CoordinatorLink(self.cluster, metadata.group_id, 0, self.retry_backoff_s)
            await group_link.send(lambda: request, self.timeout_s, _offsets_error)
        except PymqError as err:
            self.abortable(err)
            raise

    async def commit(self) -> None:
        self._require("commit_transaction", TxnPhase.IN_TRANSACTION)
        await self._settle("commit")
        await self._end(committed=True)
        self.phase = TxnPhase.READY

    async def prepare(self, label: str | None) -> PreparedTransaction:
        self._require("prepare_transaction", TxnPhase.IN_TRANSACTION)
        await self._settle("prepare")
        sequences = self.sequences
        await self._end(committed=False, prepare=True, label=label)
        self.phase = TxnPhase.PREPARED
        return PreparedTransaction(self.transactional_id, sequences.producer_id, sequences.epoch)

    async def abort(self) -> None:
        self._require("abort_transaction", TxnPhase.IN_TRANSACTION, TxnPhase.ABORTABLE)
        # Batches waiting for their partitions to join fail; the others go out and complete (their
        # partitions are in the transaction: the abort marker covers them).
        self._fail_paused(TransactionAbortedError(f"the transaction of {self.transactional_id!r} was aborted"))
        if self._adding is not None:  # partitions on their way into the transaction: then they are in it
            await asyncio.shield(self._adding)
        try:
            await self._flush()
        except PymqError:
            pass
        if self._touched:
            try:
                await self._end(committed=False)
            except InvalidTxnStateError:
                pass  # nothing of it reached the coordinator: no transaction open there
        # A new epoch: sequences start over, so no batch of the aborted transaction can collide.
        await self._init_producer_id(self.sequences.producer_id, self.sequences.epoch)
        self.error = None
        self.phase = TxnPhase.READY

    async def _settle(self, action: str) -> None:
        """Wait for every batch of the transaction; raise (the transaction is then abortable) if
        one failed or a partition could not join."""
        try:
            await self._flush()
        except PymqError as err:
            self.abortable(err)
        if self.phase is not TxnPhase.IN_TRANSACTION:
            raise self._state_error(action)

    async def _end(self, committed: bool, prepare: bool = False, label: str | None = None) -> None:
        sequences = self.sequences
        try:
            await self.link.send(lambda: EndTxnRequest(self.transactional_id, sequences.producer_id, sequences.epoch,
                                                       committed, prepare, label), self.timeout_s)
        except PymqError as err:
            self.abortable(err)
            raise


def _first_partition_error(response: Any) -> PymqError | None:
    for topic in response.topics:
        for p in topic.partitions:
            err = p.error()
            if err is not None:
                return err
    return None


def _offsets_error(response: Any) -> PymqError | None:
    err = response.error()
    return err if err is not None else _first_partition_error(response)
