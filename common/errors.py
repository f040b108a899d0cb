"""pymq's one error taxonomy: a base `PymqError`, one subclass per wire error code.

Every error that crosses the wire is a named code (docs/architecture.md, Wire protocol). The broker raises these
classes inside handlers; the server turns them into `error_code` fields; the client turns the codes
back into the same classes with `error_for_code`. `retriable` tells the client whether retrying the
same request (after a metadata refresh or a backoff) can succeed.
"""
from __future__ import annotations


class PymqError(Exception):
    """Base of every pymq error. Subclasses set `code` (wire value) and `retriable`."""

    code: int = -1
    retriable: bool = False

    def __init_subclass__(cls, wire_name: str | None = None, **kwargs: object) -> None:
        """`class XError(PymqError, wire_name="X")` registers the class as the one for its `code`:
        what `error_for_code` builds from a response. A subclass without a wire name (a finer
        kind of a registered error, e.g. one the client raises) shares its base's code."""
        super().__init_subclass__(**kwargs)
        if wire_name is None:
            return
        taken = _BY_CODE.get(cls.code)
        if taken is not None:
            raise TypeError(f"{cls.__name__} and {taken.__name__} both claim wire code {cls.code}")
        cls._wire_name = wire_name
        _BY_CODE[cls.code] = cls

    @classmethod
    def name(cls) -> str:
        """The wire name (e.g. 'UNKNOWN_TOPIC_OR_PARTITION') of a registered class, else the class name."""
        return cls.__dict__.get("_wire_name", cls.__name__)


_BY_CODE: dict[int, type[PymqError]] = {}  # filled by PymqError.__init_subclass__


class UnknownServerError(PymqError, wire_name="UNKNOWN_SERVER_ERROR"):
    code = -1


class CorruptMessageError(PymqError, wire_name="CORRUPT_MESSAGE"):
    """A record batch failed validation: bad magic, length, CRC or header fields."""

    code = 2
    # Kafka retries these; here TCP checksums make transit corruption rare, and a producer that
    # built a bad batch would rebuild the same bytes, so retrying only burns the delivery timeout.
    retriable = False


class CorruptRecordError(CorruptMessageError, wire_name="CORRUPT_RECORD"):
    """A fetched batch failed the consumer's checks (CRC, structure). Raised by `poll` only after
    every intact record before it was delivered, with the consumer's position at the bad batch
    (`offset`). `last_offset` is the bad batch's last offset when its header is intact (its CRC
    held), else `offset`: `seek((topic, partition), last_offset + 1)` skips exactly the bad batch
    (one record at a time when its header is damaged too), never a record of the next one.
    A client-side condition (the broker's CORRUPT_MESSAGE is its base class), hence a code >= 1000."""

    code = 1004

    def __init__(self, message: str, topic: str = "", partition: int = -1, offset: int = -1,
                 last_offset: int | None = None) -> None:
        super().__init__(message)
        self.topic, self.partition, self.offset = topic, partition, offset
        self.last_offset = offset if last_offset is None else last_offset

    def __reduce__(self) -> tuple:  # keeps the fields when pickled (e.g. across processes)
        return type(self), (str(self), self.topic, self.partition, self.offset, self.last_offset)


class UnknownTopicOrPartitionError(PymqError, wire_name="UNKNOWN_TOPIC_OR_PARTITION"):
    code = 3
    retriable = True  # the topic may still be being created


class OffsetOutOfRangeError(PymqError, wire_name="OFFSET_OUT_OF_RANGE"):
    code = 1


class InvalidFetchSizeError(PymqError, wire_name="INVALID_FETCH_SIZE"):
    code = 4


class NotLeaderError(PymqError, wire_name="NOT_LEADER"):
    code = 6
    retriable = True


class LeaderNotAvailableError(PymqError, wire_name="LEADER_NOT_AVAILABLE"):
    """A Metadata answer names no leader for the partition: the broker answering cannot vouch for
    its leadership now (it is fenced: its session lapsed and it has not caught up since). Ask again."""

    code = 5
    retriable = True


class RequestTimedOutError(PymqError, wire_name="REQUEST_TIMED_OUT"):
    code = 7
    retriable = True


class MessageTooLargeError(PymqError, wire_name="MESSAGE_TOO_LARGE"):
    code = 10


class NetworkError(PymqError, wire_name="NETWORK_EXCEPTION"):
    """The connection failed or closed before a response arrived."""

    code = 13
    retriable = True


class NotAPymqBrokerError(NetworkError):
    """The peer answered with bytes that are no pymq response (an HTTP server, a metrics port, a
    Kafka broker given as bootstrap): asking it again gives the same answer."""

    retriable = False


class InvalidTopicError(PymqError, wire_name="INVALID_TOPIC_EXCEPTION"):
    code = 17


class RecordListTooLargeError(PymqError, wire_name="RECORD_LIST_TOO_LARGE"):
    code = 18


class NotEnoughReplicasError(PymqError, wire_name="NOT_ENOUGH_REPLICAS"):
    """acks=all while the partition has fewer in-sync replicas than min.insync.replicas: nothing
    was written."""

    code = 19
    retriable = True


class NotEnoughReplicasAfterAppendError(PymqError, wire_name="NOT_ENOUGH_REPLICAS_AFTER_APPEND"):
    """acks=all: the records were written by the leader, but the ISR shrank below
    min.insync.replicas before they were replicated. A retry may store them twice."""

    code = 20
    retriable = True


class ReplicaNotAvailableError(PymqError, wire_name="REPLICA_NOT_AVAILABLE"):
    """A replica fetch from a broker that is not a replica of the partition."""

    code = 9
    retriable = True


class InvalidRequiredAcksError(PymqError, wire_name="INVALID_REQUIRED_ACKS"):
    code = 21


class OffsetMetadataTooLargeError(PymqError, wire_name="OFFSET_METADATA_TOO_LARGE"):
    """An offset commit's metadata string is longer than the coordinator keeps."""

    code = 12


class CoordinatorLoadInProgressError(PymqError, wire_name="COORDINATOR_LOAD_IN_PROGRESS"):
    """The coordinator is still loading the group's state from its log; retry after a backoff."""

    code = 14
    retriable = True


class CoordinatorNotAvailableError(PymqError, wire_name="COORDINATOR_NOT_AVAILABLE"):
    """No coordinator for the key right now (its partition has no leader, or the group is being
    unloaded); find the coordinator again."""

    code = 15
    retriable = True


class NotCoordinatorError(PymqError, wire_name="NOT_COORDINATOR"):
    """This broker is not the coordinator of the group; find the coordinator again."""

    code = 16
    retriable = True


class IllegalGenerationError(PymqError, wire_name="ILLEGAL_GENERATION"):
    code = 22


class InconsistentGroupProtocolError(PymqError, wire_name="INCONSISTENT_GROUP_PROTOCOL"):
    """The member's protocol type or protocols share nothing with the group's."""

    code = 23


class InvalidGroupIdError(PymqError, wire_name="INVALID_GROUP_ID"):
    code = 24


class UnknownMemberIdError(PymqError, wire_name="UNKNOWN_MEMBER_ID"):
    code = 25


class InvalidSessionTimeoutError(PymqError, wire_name="INVALID_SESSION_TIMEOUT"):
    """The session timeout is outside the broker's group.min/max.session.timeout.ms."""

    code = 26


class InvalidTimestampError(PymqError, wire_name="INVALID_TIMESTAMP"):
    code = 32


class UnsupportedVersionError(PymqError, wire_name="UNSUPPORTED_VERSION"):
    code = 35


class TopicAlreadyExistsError(PymqError, wire_name="TOPIC_ALREADY_EXISTS"):
    code = 36


class InvalidPartitionsError(PymqError, wire_name="INVALID_PARTITIONS"):
    code = 37


class InvalidReplicationFactorError(PymqError, wire_name="INVALID_REPLICATION_FACTOR"):
    code = 38


class InvalidReplicaAssignmentError(PymqError, wire_name="INVALID_REPLICA_ASSIGNMENT"):
    """A reassignment names no replicas, one broker twice, or a broker that is not alive."""

    code = 39


class InvalidRequestError(PymqError, wire_name="INVALID_REQUEST"):
    """The request is malformed: bad framing, bad control fields, unknown API key."""

    code = 42


class RebalanceInProgressError(PymqError, wire_name="REBALANCE_IN_PROGRESS"):
    code = 27
    retriable = True


class OutOfOrderSequenceError(PymqError, wire_name="OUT_OF_ORDER_SEQUENCE"):
    code = 45


class InvalidProducerEpochError(PymqError, wire_name="INVALID_PRODUCER_EPOCH"):
    """A produce carried a producer epoch older than the one the partition knows for that producer
    id: a zombie instance of an idempotent or transactional producer. Nothing was written."""

    code = 47


class InvalidTxnStateError(PymqError, wire_name="INVALID_TXN_STATE"):
    """The request is not valid in the transaction's current state (e.g. commit while aborting)."""

    code = 48


class InvalidProducerIdMappingError(PymqError, wire_name="INVALID_PRODUCER_ID_MAPPING"):
    """The producer id (and epoch) a transactional request names is not the one the transaction
    coordinator holds for that transactional id."""

    code = 49


class InvalidTransactionTimeoutError(PymqError, wire_name="INVALID_TRANSACTION_TIMEOUT"):
    """transaction.timeout.ms is not within (0, transaction.max.timeout.ms]."""

    code = 50


class ConcurrentTransactionsError(PymqError, wire_name="CONCURRENT_TRANSACTIONS"):
    """The transactional id's previous transaction is still being completed (its markers are being
    written): retry shortly."""

    code = 51
    retriable = True


class TransactionCoordinatorFencedError(PymqError, wire_name="TRANSACTION_COORDINATOR_FENCED"):
    """Transaction markers from a coordinator whose epoch is older than one the partition has seen."""

    code = 52


class UnknownProducerIdError(PymqError, wire_name="UNKNOWN_PRODUCER_ID"):
    """The broker holds no state for the producer id the request names."""

    code = 59


class ProducerFencedError(PymqError, wire_name="PRODUCER_FENCED"):
    """A newer producer with the same transactional.id started (InitProducerId bumped the epoch):
    this instance may send nothing more. Close it."""

    code = 90


class InvalidConfigError(PymqError, wire_name="INVALID_CONFIG"):
    code = 40


class KafkaStorageError(PymqError, wire_name="KAFKA_STORAGE_ERROR"):
    """The log directory failed an I/O operation (disk full, permission, read error)."""

    code = 56
    retriable = True


class LogInvariantError(KafkaStorageError):
    """A partition log's own invariant broke: an append or a segment that does not follow the
    offsets before it, a segment list changed out of order. The log's state cannot be trusted to
    go on as is, like a failing disk (KAFKA_STORAGE_ERROR on the wire); the message names the
    file and the offsets."""


class FencedLeaderEpochError(PymqError, wire_name="FENCED_LEADER_EPOCH"):
    """The request names a leader epoch older than the partition's: the sender's metadata is stale."""

    code = 74
    retriable = True


class UnknownLeaderEpochError(PymqError, wire_name="UNKNOWN_LEADER_EPOCH"):
    """The request names a leader epoch newer than the partition's: this broker has not caught up."""

    code = 75
    retriable = True


class InconsistentTopicIdError(KafkaStorageError, wire_name="INCONSISTENT_TOPIC_ID"):
    """Another incarnation of the topic (deleted and re-created) than the one meant: a partition
    directory whose topic id is not the metadata's, or a Fetch naming a topic id the broker's log
    of that name does not have (KIP-516)."""

    code = 103
    retriable = False


class PolicyViolationError(PymqError, wire_name="POLICY_VIOLATION"):
    code = 44


class NonEmptyGroupError(PymqError, wire_name="NON_EMPTY_GROUP"):
    """The group still has members, so it cannot be deleted."""

    code = 68


class GroupIdNotFoundError(PymqError, wire_name="GROUP_ID_NOT_FOUND"):
    code = 69


class MemberIdRequiredError(PymqError, wire_name="MEMBER_ID_REQUIRED"):
    """A new member joined without a member id: the coordinator assigned one (the JoinGroup
    response's `member_id`), and the member must join again with it."""

    code = 79


class GroupMaxSizeReachedError(PymqError, wire_name="GROUP_MAX_SIZE_REACHED"):
    """The group has group.max.size members already."""

    code = 81


class FencedInstanceIdError(PymqError, wire_name="FENCED_INSTANCE_ID"):
    """Another member joined with the same group_instance_id (static membership): this one is fenced."""

    code = 82


class GroupSubscribedToTopicError(PymqError, wire_name="GROUP_SUBSCRIBED_TO_TOPIC"):
    """The group's active members consume the topic, so its committed offsets cannot be deleted."""

    code = 86


class InvalidRecordError(PymqError, wire_name="INVALID_RECORD"):
    """A batch is well-formed but not one its sender may write: a producer batch whose offsets
    do not run contiguously over its records (or that carries compaction's offset deltas), or a
    control or transactional batch from a client. Kafka's INVALID_RECORD."""

    code = 87


class BrokerNotAvailableError(PymqError, wire_name="BROKER_NOT_AVAILABLE"):
    code = 8
    retriable = True


# 900..999: wire codes for pymq conditions Kafka has no code for.
class VersionConflictError(PymqError, wire_name="CONCURRENT_METADATA_UPDATE"):
    """A metadata compare-and-set lost to a concurrent writer (another broker); retry the request."""

    code = 900
    retriable = True


class PartitionNotAssignedError(PymqError, wire_name="PARTITION_NOT_ASSIGNED"):
    """A group member committed an offset for a partition its current assignment does not hold."""

    code = 901


class WorkQueueFullError(PymqError, wire_name="WORK_QUEUE_FULL"):
    """A bounded queue of the broker's background work is full (e.g. remote reads past
    `remote.log.reader.max.pending.tasks`); retry after a backoff."""

    code = 902
    retriable = True


class MetadataStoreUnavailableError(PymqError, wire_name="METADATA_STORE_UNAVAILABLE"):
    """The cluster's metadata store (etcd) did not answer: a change to topics or partition state
    cannot be made now. Brokers keep serving the partitions they lead; retry after a backoff."""

    code = 904
    retriable = True


class MetadataStoreLimitError(PymqError, wire_name="METADATA_STORE_LIMIT"):
    """The metadata store refused a transaction as too large (etcd's `--max-txn-ops` or
    `--max-request-bytes` is below what pymq needs; docs/cluster.md names the values)."""

    code = 905


class StaleManifestError(PymqError, wire_name="STALE_MANIFEST"):
    """A change to a partition's remote manifest (a compaction's segment swap) named a manifest
    version that is no longer the current one: the broker uploaded, expired or swapped segments
    since it was read. Nothing changed; read the manifest again and redo the work on it."""

    code = 903


# Client-side conditions that never come from a broker use codes >= 1000.
class ProducerClosedError(PymqError, wire_name="PRODUCER_CLOSED"):
    code = 1000


class DeliveryTimeoutError(PymqError, wire_name="DELIVERY_TIMEOUT"):
    """A record was not acknowledged within the producer's `delivery_timeout_ms`."""

    code = 1001


class TransactionAbortedError(PymqError, wire_name="TRANSACTION_ABORTED"):
    """A record was not sent because its transaction was aborted first (abort_transaction)."""

    code = 1006


class ConsumerStoppedError(PymqError, wire_name="CONSUMER_STOPPED"):
    code = 1002


class NoOffsetForPartitionError(PymqError, wire_name="NO_OFFSET_FOR_PARTITION"):
    code = 1003


class DataLossError(PymqError, wire_name="DATA_LOSS"):
    """Offsets a bounded read needed were deleted (retention) or are gone (truncation) before it
    read them; names topic, partition and the offsets [start, end) that are lost."""

    code = 1005

    def __init__(self, message: str, topic: str = "", partition: int = -1, start: int = -1, end: int = -1) -> None:
        super().__init__(message)
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __reduce__(self) -> tuple:  # keeps the fields when pickled (Spark tasks, processes)
        return type(self), (str(self), self.topic, self.partition, self.start, self.end)


class ClusterAuthorizationFailedError(PymqError, wire_name="CLUSTER_AUTHORIZATION_FAILED"):
    """A cluster action (a replica fetch, an inter-broker handshake) from a connection that is not
    identified as a registered broker (docs/cluster.md, Inter-broker identity). Nothing changed."""

    code = 31


class LogDirInUseError(KafkaStorageError):
    """A broker's log.dir is locked by another running broker (broker/log/log_dir_lock.py). Raised
    at start-up, never on the wire: the second broker refuses to start instead of corrupting the first's logs."""


class TooManyElementsError(InvalidRequestError):
    """A request holds more list items and map entries than `request.max.elements`
    (protocol/messages/limits.py): refused before any per-element work, INVALID_REQUEST on the wire."""


NONE = 0


def error_for_code(code: int, message: str | None = None) -> PymqError:
    """The exception instance for a wire `code` (UnknownServerError for codes we do not know)."""
    cls = _BY_CODE.get(code, UnknownServerError)
    return cls(message or cls.name())


def error_name(code: int) -> str:
    """The wire name of `code`, e.g. 3 -> 'UNKNOWN_TOPIC_OR_PARTITION'; 0 -> 'NONE'."""
    if code == NONE:
        return "NONE"
    return _BY_CODE.get(code, UnknownServerError).name()


class UnstableOffsetCommitError(PymqError, wire_name="UNSTABLE_OFFSET_COMMIT"):
    """OffsetFetch with require_stable: an open transaction holds offsets of the partition, to
    become its committed offset (or be dropped) when the transaction ends. Retry (KIP-447)."""

    code = 88
    retriable = True
