"""pymq's one error taxonomy: a base `PymqError`, one subclass per wire error code.

Every error that crosses the wire is a named code (DESIGN.md section 4). The broker raises these
classes inside handlers; the server turns them into `error_code` fields; the client turns the codes
back into the same classes with `error_for_code`. `retriable` tells the client whether retrying the
same request (after a metadata refresh or a backoff) can succeed.
"""
from __future__ import annotations


class PymqError(Exception):
    """Base of every pymq error. Subclasses set `code` (wire value) and `retriable`."""

    code: int = -1
    retriable: bool = False

    @classmethod
    def name(cls) -> str:
        return _NAMES.get(cls, cls.__name__)


class UnknownServerError(PymqError):
    code = -1


class CorruptMessageError(PymqError):
    """A record batch failed validation: bad magic, length, CRC or header fields."""

    code = 2
    # Kafka retries these; here TCP checksums make transit corruption rare, and a producer that
    # built a bad batch would rebuild the same bytes, so retrying only burns the delivery timeout.
    retriable = False


class CorruptRecordError(CorruptMessageError):
    """A fetched batch failed the consumer's checks (CRC, structure). Raised by `poll` only after
    every intact record before it was delivered, with the consumer's position at the bad batch:
    `seek((topic, partition), offset + 1)` skips it (one record at a time if it held several).
    A client-side condition (the broker's CORRUPT_MESSAGE is its base class), hence a code >= 1000."""

    code = 1004

    def __init__(self, message: str, topic: str = "", partition: int = -1, offset: int = -1) -> None:
        super().__init__(message)
        self.topic, self.partition, self.offset = topic, partition, offset

    def __reduce__(self) -> tuple:  # keeps the fields when pickled (e.g. across processes)
        return type(self), (str(self), self.topic, self.partition, self.offset)


class UnknownTopicOrPartitionError(PymqError):
    code = 3
    retriable = True  # the topic may still be being created


class OffsetOutOfRangeError(PymqError):
    code = 1


class InvalidFetchSizeError(PymqError):
    code = 4


class NotLeaderError(PymqError):
    code = 6
    retriable = True


class RequestTimedOutError(PymqError):
    code = 7
    retriable = True


class MessageTooLargeError(PymqError):
    code = 10


class NetworkError(PymqError):
    """The connection failed or closed before a response arrived."""

    code = 13
    retriable = True


class InvalidTopicError(PymqError):
    code = 17


class RecordListTooLargeError(PymqError):
    code = 18


class NotEnoughReplicasError(PymqError):
    code = 19
    retriable = True


class InvalidRequiredAcksError(PymqError):
    code = 21


class OffsetMetadataTooLargeError(PymqError):
    """An offset commit's metadata string is longer than the coordinator keeps."""

    code = 12


class CoordinatorLoadInProgressError(PymqError):
    """The coordinator is still loading the group's state from its log; retry after a backoff."""

    code = 14
    retriable = True


class CoordinatorNotAvailableError(PymqError):
    """No coordinator for the key right now (its partition has no leader, or the group is being
    unloaded); find the coordinator again."""

    code = 15
    retriable = True


class NotCoordinatorError(PymqError):
    """This broker is not the coordinator of the group; find the coordinator again."""

    code = 16
    retriable = True


class IllegalGenerationError(PymqError):
    code = 22


class InconsistentGroupProtocolError(PymqError):
    """The member's protocol type or protocols share nothing with the group's."""

    code = 23


class InvalidGroupIdError(PymqError):
    code = 24


class UnknownMemberIdError(PymqError):
    code = 25


class InvalidSessionTimeoutError(PymqError):
    """The session timeout is outside the broker's group.min/max.session.timeout.ms."""

    code = 26


class InvalidTimestampError(PymqError):
    code = 32


class UnsupportedVersionError(PymqError):
    code = 35


class TopicAlreadyExistsError(PymqError):
    code = 36


class InvalidPartitionsError(PymqError):
    code = 37


class InvalidReplicationFactorError(PymqError):
    code = 38


class InvalidRequestError(PymqError):
    """The request is malformed: bad framing, bad control fields, unknown API key."""

    code = 42


class RebalanceInProgressError(PymqError):
    code = 27
    retriable = True


class OutOfOrderSequenceError(PymqError):
    code = 45


class InvalidConfigError(PymqError):
    code = 40


class KafkaStorageError(PymqError):
    """The log directory failed an I/O operation (disk full, permission, read error)."""

    code = 56
    retriable = True


class FencedLeaderEpochError(PymqError):
    """The request names a leader epoch older than the partition's: the sender's metadata is stale."""

    code = 74
    retriable = True


class UnknownLeaderEpochError(PymqError):
    """The request names a leader epoch newer than the partition's: this broker has not caught up."""

    code = 75
    retriable = True


class InconsistentTopicIdError(KafkaStorageError):
    """A partition directory belongs to another incarnation of its topic (deleted and re-created)."""

    code = 103
    retriable = False


class PolicyViolationError(PymqError):
    code = 44


class NonEmptyGroupError(PymqError):
    """The group still has members, so it cannot be deleted."""

    code = 68


class GroupIdNotFoundError(PymqError):
    code = 69


class MemberIdRequiredError(PymqError):
    """A new member joined without a member id: the coordinator assigned one (the JoinGroup
    response's `member_id`), and the member must join again with it."""

    code = 79


class GroupMaxSizeReachedError(PymqError):
    """The group has group.max.size members already."""

    code = 81


class FencedInstanceIdError(PymqError):
    """Another member joined with the same group_instance_id (static membership): this one is fenced."""

    code = 82


class GroupSubscribedToTopicError(PymqError):
    """The group's active members consume the topic, so its committed offsets cannot be deleted."""

    code = 86


class BrokerNotAvailableError(PymqError):
    code = 8
    retriable = True


# 900..999: wire codes for pymq conditions Kafka has no code for.
class VersionConflictError(PymqError):
    """A metadata compare-and-set lost to a concurrent writer (another broker); retry the request."""

    code = 900
    retriable = True


class PartitionNotAssignedError(PymqError):
    """A group member committed an offset for a partition its current assignment does not hold."""

    code = 901


class WorkQueueFullError(PymqError):
    """A bounded queue of the broker's background work is full (e.g. remote reads past
    `remote.log.reader.max.pending.tasks`); retry after a backoff."""

    code = 902
    retriable = True


# Client-side conditions that never come from a broker use codes >= 1000.
class ProducerClosedError(PymqError):
    code = 1000


class DeliveryTimeoutError(PymqError):
    """A record was not acknowledged within the producer's `delivery_timeout_ms`."""

    code = 1001


class ConsumerStoppedError(PymqError):
    code = 1002


class NoOffsetForPartitionError(PymqError):
    code = 1003


class DataLossError(PymqError):
    """Offsets a bounded read needed were deleted (retention) or are gone (truncation) before it
    read them; names topic, partition and the offsets [start, end) that are lost."""

    code = 1005

    def __init__(self, message: str, topic: str = "", partition: int = -1, start: int = -1, end: int = -1) -> None:
        super().__init__(message)
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __reduce__(self) -> tuple:  # keeps the fields when pickled (Spark tasks, processes)
        return type(self), (str(self), self.topic, self.partition, self.start, self.end)


_NAMES: dict[type[PymqError], str] = {
    UnknownServerError: "UNKNOWN_SERVER_ERROR",
    CorruptMessageError: "CORRUPT_MESSAGE",
    UnknownTopicOrPartitionError: "UNKNOWN_TOPIC_OR_PARTITION",
    OffsetOutOfRangeError: "OFFSET_OUT_OF_RANGE",
    InvalidFetchSizeError: "INVALID_FETCH_SIZE",
    NotLeaderError: "NOT_LEADER",
    RequestTimedOutError: "REQUEST_TIMED_OUT",
    MessageTooLargeError: "MESSAGE_TOO_LARGE",
    NetworkError: "NETWORK_EXCEPTION",
    InvalidTopicError: "INVALID_TOPIC_EXCEPTION",
    RecordListTooLargeError: "RECORD_LIST_TOO_LARGE",
    NotEnoughReplicasError: "NOT_ENOUGH_REPLICAS",
    InvalidRequiredAcksError: "INVALID_REQUIRED_ACKS",
    IllegalGenerationError: "ILLEGAL_GENERATION",
    InvalidTimestampError: "INVALID_TIMESTAMP",
    UnsupportedVersionError: "UNSUPPORTED_VERSION",
    TopicAlreadyExistsError: "TOPIC_ALREADY_EXISTS",
    InvalidPartitionsError: "INVALID_PARTITIONS",
    InvalidReplicationFactorError: "INVALID_REPLICATION_FACTOR",
    InvalidRequestError: "INVALID_REQUEST",
    RebalanceInProgressError: "REBALANCE_IN_PROGRESS",
    OutOfOrderSequenceError: "OUT_OF_ORDER_SEQUENCE",
    InvalidConfigError: "INVALID_CONFIG",
    KafkaStorageError: "KAFKA_STORAGE_ERROR",
    FencedLeaderEpochError: "FENCED_LEADER_EPOCH",
    UnknownLeaderEpochError: "UNKNOWN_LEADER_EPOCH",
    InconsistentTopicIdError: "INCONSISTENT_TOPIC_ID",
    PolicyViolationError: "POLICY_VIOLATION",
    BrokerNotAvailableError: "BROKER_NOT_AVAILABLE",
    OffsetMetadataTooLargeError: "OFFSET_METADATA_TOO_LARGE",
    CoordinatorLoadInProgressError: "COORDINATOR_LOAD_IN_PROGRESS",
    CoordinatorNotAvailableError: "COORDINATOR_NOT_AVAILABLE",
    NotCoordinatorError: "NOT_COORDINATOR",
    InconsistentGroupProtocolError: "INCONSISTENT_GROUP_PROTOCOL",
    InvalidGroupIdError: "INVALID_GROUP_ID",
    UnknownMemberIdError: "UNKNOWN_MEMBER_ID",
    InvalidSessionTimeoutError: "INVALID_SESSION_TIMEOUT",
    NonEmptyGroupError: "NON_EMPTY_GROUP",
    GroupIdNotFoundError: "GROUP_ID_NOT_FOUND",
    MemberIdRequiredError: "MEMBER_ID_REQUIRED",
    GroupMaxSizeReachedError: "GROUP_MAX_SIZE_REACHED",
    FencedInstanceIdError: "FENCED_INSTANCE_ID",
    GroupSubscribedToTopicError: "GROUP_SUBSCRIBED_TO_TOPIC",
    VersionConflictError: "CONCURRENT_METADATA_UPDATE",
    PartitionNotAssignedError: "PARTITION_NOT_ASSIGNED",
    WorkQueueFullError: "WORK_QUEUE_FULL",
    ProducerClosedError: "PRODUCER_CLOSED",
    DeliveryTimeoutError: "DELIVERY_TIMEOUT",
    ConsumerStoppedError: "CONSUMER_STOPPED",
    NoOffsetForPartitionError: "NO_OFFSET_FOR_PARTITION",
    CorruptRecordError: "CORRUPT_RECORD",
    DataLossError: "DATA_LOSS",
}

NONE = 0
_BY_CODE: dict[int, type[PymqError]] = {cls.code: cls for cls in _NAMES}
assert len(_BY_CODE) == len(_NAMES), "two error classes share a wire code"


def error_for_code(code: int, message: str | None = None) -> PymqError:
    """The exception instance for a wire `code` (UnknownServerError for codes we do not know)."""
    cls = _BY_CODE.get(code, UnknownServerError)
    return cls(message or cls.name())


def error_name(code: int) -> str:
    """The wire name of `code`, e.g. 3 -> 'UNKNOWN_TOPIC_OR_PARTITION'; 0 -> 'NONE'."""
    if code == NONE:
        return "NONE"
    return _BY_CODE.get(code, UnknownServerError).name()
