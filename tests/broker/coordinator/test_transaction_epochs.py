"""The transaction coordinator's producer epochs, as a pure state machine: a new instance fences
the old one; the producer's own bump after an abort, retried because its answer was lost, gets
the epoch it was given (Kafka's lastProducerEpoch), while any other older epoch stays fenced; and
the records round-trip the remembered epoch, reading records written before it existed."""
from __future__ import annotations

import itertools
from typing import Any

import msgpack
import pytest

from broker.coordinator.results import Result
from broker.coordinator.transaction_coordinator import TransactionCoordinator, TxnConfig, WriteMarkers
from broker.coordinator.transaction_records import TxnMetadata, TxnRecordSerde, TxnState
from common.errors import ConcurrentTransactionsError, ProducerFencedError, error_for_code
from protocol.messages.base import TopicRequest
from protocol.messages.transactions import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

TXN = "tx-a"


class Harness:
    """One coordinator leading the single `__transaction_state` partition; appends succeed and
    markers are written as soon as they are asked for."""

    def __init__(self) -> None:
        self.coordinator = TransactionCoordinator(TxnConfig(state_partitions=1))
        self.coordinator.begin_load(0)
        self.coordinator.finish_load(0, 0)
        self.now = 0
        self.replies: dict[Any, Any] = {}
        self._tokens = itertools.count()

    def apply(self, result: Result) -> None:
        for token, response in result.replies:
            self.replies[token] = response
        for append in result.appends:
            self.apply(append.complete(None, self.now))
        for effect in result.effects:
            assert isinstance(effect, WriteMarkers)
            self.apply(self.coordinator.markers_written(effect, self.now))

    def call(self, method: str, request: Any, *extra: Any) -> Any:
        token = next(self._tokens)
        self.now += 1
        self.apply(getattr(self.coordinator, method)(request, token, self.now, *extra))
        return self.replies.pop(token)

    def init(self, producer_id: int = -1, epoch: int = -1) -> Any:
        return self.call("init_producer_id", InitProducerIdRequest(TXN, 60_000, producer_id, epoch), 42)

    def add(self, producer_id: int, epoch: int) -> Any:
        return self.call("add_partitions", AddPartitionsToTxnRequest(
            TXN, producer_id, epoch, (TopicRequest("out", (0,)),)), lambda topic, p: True)

    def abort(self, producer_id: int, epoch: int) -> Any:
        return self.call("end_txn", EndTxnRequest(TXN, producer_id, epoch, False))


def error_of(response: Any) -> type | None:
    return None if response.error_code == 0 else type(error_for_code(response.error_code))


def ids(response: Any) -> tuple[int, int]:
    assert error_of(response) is None, response
    return response.producer_id, response.producer_epoch


def test_a_retried_bump_gets_the_epoch_it_was_given() -> None:
    h = Harness()
    pid, epoch = ids(h.init())
    h.add(pid, epoch)
    h.abort(pid, epoch)
    bumped = ids(h.init(pid, epoch))
    assert bumped == (pid, epoch + 1)
    assert ids(h.init(pid, epoch)) == bumped  # the answer was lost: the retry changes nothing
    assert h.coordinator.txns[TXN].producer_epoch == epoch + 1


def test_an_epoch_older_than_the_last_bump_is_fenced() -> None:
    h = Harness()
    pid, epoch = ids(h.init())
    ids(h.init(pid, epoch))
    ids(h.init(pid, epoch + 1))
    assert error_of(h.init(pid, epoch)) is ProducerFencedError


def test_after_a_new_instance_an_older_epoch_is_fenced_even_if_it_just_bumped() -> None:
    """A zombie whose bump was answered must not get the new instance's epoch by retrying it."""
    h = Harness()
    pid, epoch = ids(h.init())
    ids(h.init(pid, epoch))  # the zombie's own bump: epoch + 1, remembered epoch `epoch`
    assert ids(h.init()) == (pid, epoch + 2)  # a new instance
    assert error_of(h.init(pid, epoch)) is ProducerFencedError
    assert error_of(h.init(pid, epoch + 1)) is ProducerFencedError


def test_a_retried_bump_after_a_transaction_began_under_the_new_epoch_is_fenced() -> None:
    h = Harness()
    pid, epoch = ids(h.init())
    ids(h.init(pid, epoch))
    h.add(pid, epoch + 1)
    assert error_of(h.init(pid, epoch)) is ProducerFencedError
    assert h.coordinator.txns[TXN].state is TxnState.ONGOING  # untouched


def test_a_bump_while_the_transaction_is_open_aborts_it_and_its_retry_gets_the_new_epoch() -> None:
    """The producer bumps while the coordinator still has its transaction open (an abort that did
    not reach the coordinator): the transaction is aborted under the next epoch, the producer is
    told to retry, and the retry is answered with that epoch, not PRODUCER_FENCED."""
    h = Harness()
    pid, epoch = ids(h.init())
    h.add(pid, epoch)
    assert error_of(h.init(pid, epoch)) is ConcurrentTransactionsError
    assert h.coordinator.txns[TXN].state is TxnState.COMPLETE_ABORT
    assert ids(h.init(pid, epoch)) == (pid, epoch + 1)


def test_a_timed_out_transaction_fences_its_producer_for_good() -> None:
    h = Harness()
    pid, epoch = ids(h.init())
    ids(h.init(pid, epoch))
    h.add(pid, epoch + 1)
    h.now += 60_001
    h.apply(h.coordinator.tick(h.now))
    assert h.coordinator.txns[TXN].producer_epoch == epoch + 2
    for stale in (epoch, epoch + 1):
        assert error_of(h.init(pid, stale)) is ProducerFencedError


@pytest.mark.parametrize("last_epoch", [-1, 4])
def test_the_record_keeps_the_remembered_epoch(last_epoch: int) -> None:
    serde = TxnRecordSerde()
    meta = TxnMetadata(TXN, 7, 5, 60_000, TxnState.COMPLETE_ABORT, last_epoch=last_epoch)
    assert serde.deserialize(*serde.serialize(TXN, meta)) == (TXN, meta)


def test_a_record_written_before_the_remembered_epoch_existed_reads_as_none_remembered() -> None:
    serde = TxnRecordSerde()
    key, value = serde.serialize(TXN, TxnMetadata(TXN, 7, 5, 60_000, last_epoch=4))
    fields = msgpack.unpackb(value)
    del fields["last_epoch"]
    assert serde.deserialize(key, msgpack.packb(fields))[1].last_epoch == -1
