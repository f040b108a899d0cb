"""Request handlers: the dispatcher the server calls, and one handler per API family.

Handlers never see frames or sockets: the server decodes a `Request` frame and calls
`RequestHandlers.handle`, which decodes and validates the typed request message
(`protocol.messages`) within the broker's request limits (`request.max.elements`, the
group fields' bounds: `protocol.messages.limits`; large reads are decoded and their
responses encoded on a worker pool, `OFF_LOOP_READS`), runs the family's handler, and turns the
typed response into what the server writes: `(control, parts)`, where parts are bytes-like objects or `FetchSlice`s
(segment byte ranges the server sends with sendfile), or None for "no response" (produce with
acks=0). Handlers that may wait return awaitables (admin writes to the metadata store, a produce
whose acknowledgement waits) or a `DelayedOperation` parked in a purgatory (a fetch long poll:
no task per request) whose answer the server turns into a Result with `to_result`; the rest
answer synchronously. Every partition
access goes through the `ReplicaManager`: handlers never import the log (broker.log) beyond the
value types its API speaks in, nor the remote tier (broker.remote_log); the replica manager
chooses between them (tests/test_import_graph.py holds them to it).

Errors: a PymqError raised while decoding or for the whole request becomes the response's
top-level `error_code`; one that concerns a single entry (a partition, a topic) becomes that
entry's `error_code`. Nothing touches a stored byte unless every check for that partition passed
(the log validates before it writes).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Union

import protocol
from broker.cluster.broker_identity import BrokerIdentity, Session
from broker.cluster.brokers import LiveBrokers
from broker.cluster.session_fence import SessionFence
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from broker.coordinator.producer_ids import ProducerIdManager
from broker.coordinator.runtime import CoordinatorRuntime
from broker.handlers.admin import AdminHandler
from broker.handlers.fetch import FetchHandler
from broker.handlers.group import GroupHandler
from broker.handlers.list_offsets import ListOffsetsHandler
from broker.handlers.metadata import MetadataHandler
from broker.handlers.produce import ProduceHandler
from broker.handlers.replication import ReplicationHandler
from broker.handlers.tiering import TieringHandler
from broker.handlers.topic_auto_creation import TopicAutoCreation
from broker.handlers.transactions import TransactionHandler
from broker.cluster.broker_channel import BrokerChannel
from broker.log import FetchSlice
from broker.purgatory import DelayedOperation
from broker.replica_manager import ReplicaManager
from broker.request_metrics import TopicTraffic
from common.errors import InvalidRequestError, PymqError, UnknownServerError, UnsupportedVersionError
from protocol import REQUEST_TYPES, ApiKey, Message, RequestMessage
from protocol.messages.limits import RequestLimits, count_elements

log = logging.getLogger("pymq.handlers")

# Reads whose decoding and encoding run on the `large_reads` pool when they hold more than
# OFF_LOOP_ELEMENTS elements: encoding a Metadata answer for 480,000 topics alone kept the loop
# for 3 s. Only reads: they change nothing, so a later request of the connection that overtakes
# one changes nothing it answers (requests that write, or park in a purgatory, stay in order on
# the loop). Their handlers still run on the loop, in slices (broker/handlers/slices.py).
OFF_LOOP_READS = frozenset({ApiKey.METADATA, ApiKey.LIST_OFFSETS, ApiKey.DESCRIBE_GROUPS, ApiKey.OFFSET_FETCH,
                            ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_CONFIGS})
OFF_LOOP_ELEMENTS = 20_000

Part = Union[bytes, bytearray, memoryview, FetchSlice]
Result = tuple[dict[str, Any], list[Part]] | None
Answer = Union[Message, None, Awaitable[Union[Message, None]], DelayedOperation]


def error_fields(err: PymqError) -> dict[str, Any]:
    """The control map of a response to a request that failed as a whole."""
    return {"error_code": err.code, "error_message": str(err)}


def unexpected_error(err: BaseException) -> dict[str, Any]:
    """The response fields for a bug: logged with its traceback, reported as UNKNOWN_SERVER_ERROR."""
    log.exception("handler failed", exc_info=err)
    return error_fields(UnknownServerError(f"{type(err).__name__}: {err}"))


def error_result(err: BaseException) -> Result:
    """The whole response to a request that failed: its named error, or UNKNOWN_SERVER_ERROR for
    a bug (logged with its traceback)."""
    return (error_fields(err) if isinstance(err, PymqError) else unexpected_error(err), [])


def to_result(response: Message | None) -> Result:
    return None if response is None else (response.to_control(), response.payload())  # type: ignore[return-value]


def _elements(request: protocol.Request) -> int:
    """The request's element count: the frame decoder's, else counted here (up to past the
    off-loop threshold)."""
    return request.elements if request.elements >= 0 else count_elements(request.control, OFF_LOOP_ELEMENTS)


async def _result_later(pending: Awaitable[Message | None]) -> Result:
    return to_result(await pending)


class RequestHandlers:
    """The broker's API, keyed by ApiKey. Loop-local: call from the event-loop thread only."""

    def __init__(
        self,
        config: BrokerConfig,
        registry: TopicRegistry,
        replicas: ReplicaManager,
        advertised: Callable[[], tuple[str, int]],
        brokers: LiveBrokers | None = None,
        fence: SessionFence | None = None,
        incarnation: Callable[[], str] = lambda: "",
        local_host: str | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.replicas = replicas
        self.advertised = advertised
        self.broker_id: int = config["broker.id"]
        self.limits = RequestLimits(config["request.max.elements"], config["group.member.metadata.max.bytes"])
        self.traffic = TopicTraffic()  # bytes and messages in and out per topic (broker/metrics.py)
        self.brokers = brokers or LiveBrokers()
        admin = self.admin = AdminHandler(config, registry, replicas)
        metadata = MetadataHandler(self.broker_id, registry, advertised, self.brokers, fence,
                                   TopicAutoCreation(config, admin.create_topics))
        self._table: dict[int, Callable[[Any], Answer]] = {
            ApiKey.API_VERSIONS: metadata.api_versions,
            ApiKey.METADATA: metadata.metadata,
            ApiKey.CREATE_TOPICS: admin.create_topics,
            ApiKey.DELETE_TOPICS: admin.delete_topics,
            ApiKey.CREATE_PARTITIONS: admin.create_partitions,
            ApiKey.DESCRIBE_CONFIGS: admin.describe_configs,
            ApiKey.ALTER_CONFIGS: admin.alter_configs,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: admin.alter_partition_reassignments,
            ApiKey.PRODUCE: ProduceHandler(replicas, self.traffic).produce,
            ApiKey.LIST_OFFSETS: ListOffsetsHandler(replicas).list_offsets,
        }
        self.groups = GroupHandler(config, registry, replicas, admin.create_internal_topic, advertised,
                                   self.brokers.address)
        # The coordinator runtimes, each on its internal topic; the server starts and stops them.
        self.coordinators: list[CoordinatorRuntime[Any, Any]] = [self.groups.runtime]
        groups = self.groups
        self._table.update({
            ApiKey.FIND_COORDINATOR: groups.find_coordinator,
            ApiKey.JOIN_GROUP: groups.join_group,
            ApiKey.SYNC_GROUP: groups.sync_group,
            ApiKey.HEARTBEAT: groups.heartbeat,
            ApiKey.LEAVE_GROUP: groups.leave_group,
            ApiKey.OFFSET_COMMIT: groups.offset_commit,
            ApiKey.OFFSET_FETCH: groups.offset_fetch,
            ApiKey.OFFSET_DELETE: groups.offset_delete,
            ApiKey.LIST_GROUPS: groups.list_groups,
            ApiKey.DESCRIBE_GROUPS: groups.describe_groups,
            ApiKey.DELETE_GROUPS: groups.delete_groups,
        })
        # The APIs whose answer depends on who the connection is (broker/cluster/broker_identity.py).
        identity = BrokerIdentity(self.brokers)
        replication = ReplicationHandler(replicas, identity)
        self._session_table: dict[int, Callable[[Any, Session], Answer]] = {
            ApiKey.FETCH: FetchHandler(config, replicas, self.traffic, identity).fetch,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: replication.offset_for_leader_epoch,
            ApiKey.BROKER_HANDSHAKE: replication.broker_handshake,
        }
        self.transactions = TransactionHandler(
            config, registry, replicas, ProducerIdManager(registry.store, self.broker_id), admin.create_internal_topic,
            advertised, self.brokers.address, identity,
            BrokerChannel(self.broker_id, incarnation, self.brokers.address, local_host=local_host),
            groups.coordinator.partition_of, groups.offsets_topic.ensure)
        self.transactions.marker_listeners.append(groups.on_transaction_marker)
        self.coordinators.append(self.transactions.runtime)
        transactions = self.transactions
        self._table.update({
            ApiKey.INIT_PRODUCER_ID: transactions.init_producer_id,
            ApiKey.ADD_PARTITIONS_TO_TXN: transactions.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: transactions.add_offsets_to_txn,
            ApiKey.END_TXN: transactions.end_txn,
            ApiKey.DESCRIBE_TRANSACTIONS: transactions.describe_transactions,
            ApiKey.TXN_OFFSET_COMMIT: groups.txn_offset_commit,
            ApiKey.FIND_COORDINATOR: self._find_coordinator,
        })
        self._session_table[ApiKey.WRITE_TXN_MARKERS] = transactions.write_txn_markers
        tiering = TieringHandler(registry, replicas)
        self._table[ApiKey.DESCRIBE_TIERING] = tiering.describe_tiering
        self._table[ApiKey.REPLACE_REMOTE_SEGMENTS] = tiering.replace_remote_segments
        assert self._table.keys() | self._session_table.keys() == REQUEST_TYPES.keys(), \
            "every API has a handler and a request message"

    def _find_coordinator(self, request: protocol.FindCoordinatorRequest) -> Answer:
        """A group's coordinator (key_type 0) or a transactional id's (1)."""
        if request.key_type == protocol.TRANSACTION_KEY_TYPE:
            return self.transactions.find_coordinator(request)
        return self.groups.find_coordinator(request)

    def handle(self, request: protocol.Request,
               session: Session | None = None) -> Result | Awaitable[Result] | DelayedOperation:
        """Dispatch one request from the connection whose `session` it is (None: anonymous).
        Raises PymqError for request-level failures (malformed messages included)."""
        handler = self._table.get(request.api_key)
        session_handler = self._session_table.get(request.api_key)
        if handler is None and session_handler is None:
            raise InvalidRequestError(f"unknown api_key {request.api_key}")
        low, high = protocol.SUPPORTED_VERSIONS[ApiKey(request.api_key)]
        if not low <= request.api_version <= high:
            raise UnsupportedVersionError(
                f"{ApiKey(request.api_key).name} version {request.api_version} not in {low}..{high}"
            )
        request_type = REQUEST_TYPES[request.api_key]
        if handler is not None and request.api_key in OFF_LOOP_READS and _elements(request) > OFF_LOOP_ELEMENTS:
            return self._large_read(request_type, handler, request)
        message = request_type.decode(request.control, request.payload, self.limits, request.elements)
        if session_handler is not None:
            answer = session_handler(message, session or Session())
        else:
            answer = handler(message)  # type: ignore[misc]
        if isinstance(answer, Message) or answer is None:
            return to_result(answer)
        if isinstance(answer, DelayedOperation):
            return answer
        return _result_later(answer)

    async def _large_read(self, request_type: type[RequestMessage], handler: Callable[[Any], Answer],
                          request: protocol.Request) -> Result:
        """A large read: decoded and its response encoded on the `large_reads` pool, handled on the loop."""
        pool = self.replicas.executors.large_reads
        message = await pool.run(request_type.decode, request.control, request.payload, self.limits, request.elements)
        answer = handler(message)
        assert not isinstance(answer, DelayedOperation), "reads answered off the loop never park in a purgatory"
        response = await answer if isinstance(answer, Awaitable) else answer
        return await pool.run(to_result, response)
