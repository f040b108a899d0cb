"""Producer ids and transactions: InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25),
EndTxn (26), WriteTxnMarkers (27), TxnOffsetCommit (28), DescribeTransactions (65).

    InitProducerId       request  {transactional_id?, transaction_timeout_ms, producer_id, producer_epoch}
                         response {error_code: 0, result_error_code, result_error_message?, producer_id,
                                   producer_epoch, last_label?, last_committed?}
    AddPartitionsToTxn   request  {transactional_id, producer_id, producer_epoch, topics: [{name, partitions: [int]}]}
                         response {error_code: 0, topics: [{name, partitions: [{partition, error_code, error_message?}]}]}
    AddOffsetsToTxn      request  {transactional_id, producer_id, producer_epoch, group_id}
                         response {error_code: 0, result_error_code, result_error_message?}
    EndTxn               request  {transactional_id, producer_id, producer_epoch, committed, prepare, label?}
                         response {error_code: 0, result_error_code, result_error_message?}
    WriteTxnMarkers      request  {markers: [{producer_id, producer_epoch, committed, coordinator_epoch,
                                   topics: [{name, partitions: [int]}]}]}
                         response {error_code: 0, markers: [{producer_id, topics: [{name, partitions:
                                   [{partition, error_code, error_message?}]}]}]}
    TxnOffsetCommit      request  {transactional_id, group_id, producer_id, producer_epoch, generation_id,
                                   member_id, group_instance_id?, topics: [{name, partitions: [{partition,
                                   committed_offset, committed_leader_epoch, metadata}]}]}
                         response {error_code: 0, result_error_code, result_error_message?, topics: [...]}
    DescribeTransactions request  {transactional_ids: [str]}
                         response {error_code: 0, transactions: [{transactional_id, error_code,
                                   error_message?, state, producer_id, producer_epoch, timeout_ms,
                                   start_ms, label?, topics: [{name, partitions: [int]}]}]}

An idempotent producer (no `transactional_id`) asks any broker for a producer id: a new id from the
cluster's allocator, epoch 0, on every call (`producer_id`/`producer_epoch` are its current pair, or
-1). A transactional producer asks its transaction coordinator (FindCoordinator key_type 1), which
gives the same producer id with the next epoch, fencing every older instance with that
transactional id and aborting its open transaction. Its answer also says how the id's last
transaction ended (`last_label`, `last_committed`): an engine that labels its transactions (a
Spark micro-batch id) learns whether its batch was committed before it died.

EndTxn with `prepare` (pymq's two-phase commit, Kafka's KIP-939 direction) neither commits nor
aborts: the coordinator records the transaction as prepared, labelled `label`, never times it out,
and waits for an EndTxn commit or abort naming (transactional_id, producer_id, producer_epoch),
from any client: the process that prepared it may be gone.

WriteTxnMarkers goes from a transaction coordinator to partition leaders only (a registered
broker's connection): each leader appends the commit or abort marker (a control batch).

As in `group`, the coordinator's answer to a well-formed request travels as `result_error_code`
beside the whole-request `error_code` 0.
"""
from __future__ import annotations

from typing import ClassVar

from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, PartitionResponse, RequestMessage, TopicRequest, TopicResponse
from protocol.messages.group import RESULT_PREFIX, OffsetCommitPartition, PartitionNumbers
from protocol.schema import (
    BOOL,
    INT,
    NON_NEGATIVE,
    STR,
    Entries,
    Seq,
    Topics,
    error_code_field,
    error_message_field,
    message,
    wire,
)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# A prepared transaction's label (EndTxn `label`), in UTF-8 bytes: longer is INVALID_REQUEST.
LABEL_MAX_BYTES = 1_024


# -- InitProducerId ----------------------------------------------------------------------------


@message
class InitProducerIdResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    producer_id: int = wire(INT, NO_PRODUCER_ID)
    producer_epoch: int = wire(INT, NO_PRODUCER_EPOCH)
    last_label: str | None = wire(STR, None, omit=None)
    last_committed: bool | None = wire(BOOL, None, omit=None)


@message
class InitProducerIdRequest(RequestMessage[InitProducerIdResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    response_type: ClassVar[type[InitProducerIdResponse]] = InitProducerIdResponse
    transactional_id: str | None = wire(STR, None)
    transaction_timeout_ms: int = wire(INT, 60_000, check=NON_NEGATIVE)
    producer_id: int = wire(INT, NO_PRODUCER_ID)
    producer_epoch: int = wire(INT, NO_PRODUCER_EPOCH)


# -- AddPartitionsToTxn, AddOffsetsToTxn, EndTxn -----------------------------------------------


@message
class AddPartitionsToTxnResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse), ())


@message
class AddPartitionsToTxnRequest(RequestMessage[AddPartitionsToTxnResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN
    response_type: ClassVar[type[AddPartitionsToTxnResponse]] = AddPartitionsToTxnResponse
    transactional_id: str = wire(STR)
    producer_id: int = wire(INT)
    producer_epoch: int = wire(INT)
    topics: tuple[TopicRequest[int], ...] = wire(PartitionNumbers())


@message
class AddOffsetsToTxnResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)


@message
class AddOffsetsToTxnRequest(RequestMessage[AddOffsetsToTxnResponse]):
    """The group's partition of `__consumer_offsets` joins the transaction (before TxnOffsetCommit)."""

    api_key: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN
    response_type: ClassVar[type[AddOffsetsToTxnResponse]] = AddOffsetsToTxnResponse
    transactional_id: str = wire(STR)
    producer_id: int = wire(INT)
    producer_epoch: int = wire(INT)
    group_id: str = wire(STR)


@message
class EndTxnResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.END_TXN
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)


@message
class EndTxnRequest(RequestMessage[EndTxnResponse]):
    """Commit (`committed`) or abort the transaction; with `prepare`, prepare it (see the module
    docstring) and label it `label`."""

    api_key: ClassVar[ApiKey] = ApiKey.END_TXN
    response_type: ClassVar[type[EndTxnResponse]] = EndTxnResponse
    transactional_id: str = wire(STR)
    producer_id: int = wire(INT)
    producer_epoch: int = wire(INT)
    committed: bool = wire(BOOL)
    prepare: bool = wire(BOOL, False)
    label: str | None = wire(STR, None, omit=None)


# -- WriteTxnMarkers ---------------------------------------------------------------------------


@message
class TxnMarker:
    producer_id: int = wire(INT)
    producer_epoch: int = wire(INT)
    committed: bool = wire(BOOL)
    coordinator_epoch: int = wire(INT)
    topics: tuple[TopicRequest[int], ...] = wire(PartitionNumbers())


@message
class TxnMarkerResult:
    producer_id: int = wire(INT)
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse), ())


@message
class WriteTxnMarkersResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.WRITE_TXN_MARKERS
    markers: tuple[TxnMarkerResult, ...] = wire(Entries(TxnMarkerResult), ())


@message
class WriteTxnMarkersRequest(RequestMessage[WriteTxnMarkersResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.WRITE_TXN_MARKERS
    response_type: ClassVar[type[WriteTxnMarkersResponse]] = WriteTxnMarkersResponse
    markers: tuple[TxnMarker, ...] = wire(Entries(TxnMarker))


# -- TxnOffsetCommit ---------------------------------------------------------------------------


@message
class TxnOffsetCommitResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    topics: tuple[TopicResponse[PartitionResponse], ...] = wire(Topics(TopicResponse, PartitionResponse), ())


@message
class TxnOffsetCommitRequest(RequestMessage[TxnOffsetCommitResponse]):
    """Offsets committed inside the transaction: visible to the group when it commits. Sent to the
    group's coordinator after AddOffsetsToTxn. `generation_id` -1 and `member_id` "" from outside
    the group's generation (Kafka's producer without group metadata)."""

    api_key: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT
    response_type: ClassVar[type[TxnOffsetCommitResponse]] = TxnOffsetCommitResponse
    transactional_id: str = wire(STR)
    group_id: str = wire(STR)
    producer_id: int = wire(INT)
    producer_epoch: int = wire(INT)
    topics: tuple[TopicRequest[OffsetCommitPartition], ...] = wire(Topics(TopicRequest, OffsetCommitPartition))
    generation_id: int = wire(INT, -1)
    member_id: str = wire(STR, "")
    group_instance_id: str | None = wire(STR, None)


# -- DescribeTransactions ----------------------------------------------------------------------


@message
class DescribedTransaction(Outcome):
    transactional_id: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    state: str = wire(STR, "")
    producer_id: int = wire(INT, NO_PRODUCER_ID)
    producer_epoch: int = wire(INT, NO_PRODUCER_EPOCH)
    timeout_ms: int = wire(INT, 0)
    start_ms: int = wire(INT, -1)
    label: str | None = wire(STR, None, omit=None)
    topics: tuple[TopicRequest[int], ...] = wire(PartitionNumbers(), ())


@message
class DescribeTransactionsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TRANSACTIONS
    transactions: tuple[DescribedTransaction, ...] = wire(Entries(DescribedTransaction), ())


@message
class DescribeTransactionsRequest(RequestMessage[DescribeTransactionsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_TRANSACTIONS
    response_type: ClassVar[type[DescribeTransactionsResponse]] = DescribeTransactionsResponse
    transactional_ids: tuple[str, ...] = wire(Seq(str))


TRANSACTION_REQUEST_TYPES: tuple[type[RequestMessage], ...] = (
    InitProducerIdRequest, AddPartitionsToTxnRequest, AddOffsetsToTxnRequest, EndTxnRequest, WriteTxnMarkersRequest,
    TxnOffsetCommitRequest, DescribeTransactionsRequest,
)
