"""One typed message per API request and response, in modules per API family, shared by the
broker's handlers, the client and every other caller. See `base` for what each message offers."""
from protocol.messages.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    ConfigChange,
    ConfigEntry,
    ConfigValue,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    NewTopic,
    PartitionCount,
    TopicConfigs,
    TopicRef,
    TopicResult,
)
from protocol.messages.base import (
    NO_LEADER_EPOCH,
    Buffer,
    Message,
    Outcome,
    Part,
    PartitionResponse,
    PayloadRange,
    RequestMessage,
    TopicRequest,
    TopicResponse,
    code_and_message,
    part_size,
)
from protocol.messages.fetch import (
    CONSUMER_REPLICA_ID,
    ISOLATION_LEVELS,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    AbortedTransaction,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
)
from protocol.messages.group import (
    GROUP_KEY_TYPE,
    NO_GENERATION_ID,
    TRANSACTION_KEY_TYPE,
    DeletedGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupMemberResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from protocol.messages.metadata import (
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerAddress,
    MetadataRequest,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
)
from protocol.messages.offsets import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from protocol.messages.produce import (
    DEFAULT_PRODUCE_TIMEOUT_MS,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
)
from protocol.messages.reassignment import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ReassignedPartition,
)
from protocol.messages.replication import (
    UNDEFINED_EPOCH_OFFSET,
    BrokerHandshakeRequest,
    BrokerHandshakeResponse,
    EpochEndOffset,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
)
from protocol.messages.transactions import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTION_REQUEST_TYPES,
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
    TxnMarker,
    TxnMarkerResult,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from protocol.messages.tiering import (
    DescribeTieringRequest,
    DescribeTieringResponse,
    ReplaceRemoteSegmentsRequest,
    ReplaceRemoteSegmentsResponse,
    TieringPartition,
    TieringTopic,
)

# The group coordinator's requests (registered with the others below).
GROUP_REQUEST_TYPES: tuple[type[RequestMessage], ...] = (
    FindCoordinatorRequest, JoinGroupRequest, SyncGroupRequest, HeartbeatRequest, LeaveGroupRequest,
    OffsetCommitRequest, OffsetFetchRequest, ListGroupsRequest, DescribeGroupsRequest, DeleteGroupsRequest,
    OffsetDeleteRequest,
)

REQUEST_TYPES: dict[int, type[RequestMessage]] = {
    cls.api_key: cls
    for cls in (ProduceRequest, FetchRequest, ListOffsetsRequest, MetadataRequest, ApiVersionsRequest,
                CreateTopicsRequest, DeleteTopicsRequest, CreatePartitionsRequest, DescribeConfigsRequest,
                AlterConfigsRequest, OffsetForLeaderEpochRequest, AlterPartitionReassignmentsRequest,
                DescribeTieringRequest, ReplaceRemoteSegmentsRequest, BrokerHandshakeRequest, *GROUP_REQUEST_TYPES,
                *TRANSACTION_REQUEST_TYPES)
}

__all__ = [name for name in dir() if not name.startswith("_")]
