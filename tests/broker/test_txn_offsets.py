"""Transactional offset commits in a real broker process, over raw TCP with the typed messages
(consume-transform-produce's `send_offsets_to_transaction`): FindCoordinator for the
transactional id, InitProducerId, AddOffsetsToTxn, TxnOffsetCommit, then EndTxn. Until the
commit marker lands, OffsetFetch answers the old offset (UNSTABLE_OFFSET_COMMIT with
require_stable); after it, the new one; an abort keeps the old. After SIGKILL the restarted
broker replays `__consumer_offsets` (transactional records and markers) and
`__transaction_state` to the same answers, and a transaction left open across the restart still
ends as its producer says."""
from __future__ import annotations

from typing import Any

import pytest

from client import Admin
from common.errors import NONE, UnstableOffsetCommitError
from protocol import RequestMessage
from protocol.messages.base import TopicRequest
from protocol.messages.group import (
    TRANSACTION_KEY_TYPE,
    FindCoordinatorRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
)
from protocol.messages.transactions import (
    AddOffsetsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from tests.waiting import wait_until

TOPIC = "events"
GROUP = "g1"
TXN_ID = "copier"
SETTINGS = {"offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 3,
            "group.initial.rebalance.delay.ms": 0}
TIMEOUT_S = 60  # a loaded machine: loads, markers and restarts take their time


def send(client: Any, request: RequestMessage[Any]) -> Any:
    payload = b"".join(bytes(p) for p in request.payload())  # type: ignore[arg-type]
    control, reply = client.request(request.api_key, request.to_control(), payload)
    assert control["error_code"] == NONE, control
    return request.response_type.from_control(control, memoryview(bytearray(reply)))


def answered(client: Any, request: RequestMessage[Any]) -> Any:
    """The answer once the coordinator has one (a coordinator still loading, or a transaction
    whose markers are being written, is retried: COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS)."""
    answers: list[Any] = []

    def settled() -> bool:
        response = send(client, request)
        err = response.error()
        answers.append(response)
        return err is None or not err.retriable

    wait_until(settled, TIMEOUT_S, f"{type(request).__name__} is answered without a retriable error")
    err = answers[-1].error()
    assert err is None, f"{type(request).__name__}: {err!r}"
    return answers[-1]


class Producer:
    """A transactional producer speaking the raw protocol (the transaction coordinator and the
    group coordinator are the one broker)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        assert send(client, FindCoordinatorRequest(TXN_ID, TRANSACTION_KEY_TYPE)).error() is None
        started = answered(client, InitProducerIdRequest(TXN_ID, 60_000))
        self.producer_id, self.epoch = started.producer_id, started.producer_epoch

    def send_offsets(self, offsets: dict[int, int]) -> None:
        answered(self.client, AddOffsetsToTxnRequest(TXN_ID, self.producer_id, self.epoch, GROUP))
        committed = answered(self.client, TxnOffsetCommitRequest(
            TXN_ID, GROUP, self.producer_id, self.epoch, (TopicRequest(TOPIC, tuple(
                OffsetCommitPartition(p, o, metadata=f"txn {o}") for p, o in offsets.items())),)))
        assert [(p.partition, p.error()) for t in committed.topics for p in t.partitions] == \
            [(p, None) for p in offsets], committed

    def end(self, commit: bool) -> None:
        answered(self.client, EndTxnRequest(TXN_ID, self.producer_id, self.epoch, commit))


def fetched(client: Any, require_stable: bool) -> dict[int, Any]:
    """partition -> committed offset, or the partition's error class."""
    response = answered(client, OffsetFetchRequest(GROUP, (TopicRequest(TOPIC, (0, 1)),), require_stable))
    return {p.partition: type(p.error()) if p.error() else p.committed_offset
            for t in response.topics for p in t.partitions}


def settles_to(client: Any, expected: dict[int, int]) -> None:
    """Markers are written after EndTxn is answered: wait until require_stable reads `expected`."""
    wait_until(lambda: fetched(client, True) == expected, TIMEOUT_S, f"the stable offsets become {expected}")


@pytest.fixture
def server(broker_factory):
    broker = broker_factory("txn-offsets", **SETTINGS).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=2)
    return broker


def first_commit(client: Any) -> None:
    """The group's plain commit before any transaction (generation -1: a group with no members)."""
    assert send(client, FindCoordinatorRequest(GROUP)).error() is None
    committed = answered(client, OffsetCommitRequest(GROUP, -1, "", None, (TopicRequest(TOPIC, (
        OffsetCommitPartition(0, 5), OffsetCommitPartition(1, 6))),)))
    assert all(p.error() is None for t in committed.topics for p in t.partitions)


@pytest.mark.slow
def test_txn_offsets_are_visible_once_committed_and_never_when_aborted(server, raw_client) -> None:
    """Pending: the old offset, UNSTABLE with require_stable; committed: the new one; aborted:
    the old one stays."""
    with raw_client(server.port, timeout_s=30) as client:
        first_commit(client)
        producer = Producer(client)
        producer.send_offsets({0: 42})
        assert fetched(client, require_stable=True) == {0: UnstableOffsetCommitError, 1: 6}
        assert fetched(client, require_stable=False) == {0: 5, 1: 6}
        producer.end(commit=True)
        settles_to(client, {0: 42, 1: 6})
        producer.send_offsets({0: 50, 1: 51})
        assert fetched(client, require_stable=False) == {0: 42, 1: 6}
        producer.end(commit=False)
        settles_to(client, {0: 42, 1: 6})


@pytest.mark.slow
def test_txn_offsets_pending_across_a_sigkill_end_as_their_producer_says(server, raw_client) -> None:
    """Offsets pending when the broker is SIGKILLed are pending after its replay; the producer's
    commit (then, for the next transaction, abort) after the restart ends them; a last restart
    replays the markers to the same answers."""
    with raw_client(server.port, timeout_s=30) as client:
        first_commit(client)
        producer = Producer(client)
        producer.send_offsets({0: 42})
    for commit, expected in ((True, {0: 42, 1: 6}), (False, {0: 42, 1: 6})):
        server.kill()
        server.start()
        with raw_client(server.port, timeout_s=30) as client:
            assert fetched(client, require_stable=True) == {0: UnstableOffsetCommitError, 1: 6}
            assert fetched(client, require_stable=False)[0] == (5 if commit else 42)
            producer.client = client
            producer.end(commit)
            settles_to(client, expected)
            if commit:
                producer.send_offsets({0: 70})  # the next transaction, aborted after the next restart
    server.kill()
    server.start()
    with raw_client(server.port, timeout_s=30) as client:
        assert fetched(client, require_stable=True) == {0: 42, 1: 6}
