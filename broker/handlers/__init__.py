"""Request handlers: one method per API key, control fields in, (control, payload parts) out.

Handlers never see frames or sockets: the server decodes a `Request`, calls `handle`, and writes
what comes back. A result is `(control, parts)` where parts are bytes-like objects or
`FetchSlice`s (segment byte ranges the server sends with sendfile), or None for "no response"
(produce with acks=0). Handlers that may wait (fetch long poll, admin writes to the metadata
store) are coroutines; the rest return synchronously. Every partition access goes through the
`ReplicaManager` (leadership, high watermark, acknowledgement policy): a produce returns a
coroutine when an append was queued on the log writer or its acknowledgement waits for a flush.

Errors: a PymqError raised for one partition becomes that partition's `error_code`; one raised
for the whole request becomes the response's top-level `error_code`. Nothing here touches a
stored byte unless every check for that partition passed (the log validates before it writes).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Union

from broker import protocol
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from broker.errors import (
    NONE,
    KafkaStorageError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    PymqError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from broker.cluster.partition import LeaderAndIsr
from broker.cluster.topics import TopicInfo
from broker.log import AppendInfo, FetchSlice, TopicLogSpec, UnifiedLog
from broker.protocol import ApiKey, entries, field
from broker.replica_manager import ReplicaManager

log = logging.getLogger("pymq.handlers")

Part = Union[bytes, bytearray, memoryview, FetchSlice]
Result = tuple[dict[str, Any], list[Part]] | None
MAX_WAIT_MS_LIMIT = 300_000
DEFAULT_PRODUCE_TIMEOUT_MS = 30_000


def error_fields(err: PymqError) -> dict[str, Any]:
    return {"error_code": err.code, "error_message": str(err)}


def _append_failed(err: PymqError) -> dict[str, Any]:
    return {**error_fields(err), "base_offset": -1, "log_append_time": -1, "log_start_offset": -1}


class RequestHandlers:
    """The broker's API. Loop-local: call from the event-loop thread only."""

    def __init__(
        self,
        config: BrokerConfig,
        registry: TopicRegistry,
        replicas: ReplicaManager,
        advertised: Callable[[], tuple[str, int]],
    ) -> None:
        self.config = config
        self.registry = registry
        self.replicas = replicas
        self.advertised = advertised
        self.broker_id: int = config["broker.id"]
        self._table: dict[int, Callable[[dict[str, Any], memoryview], Result | Awaitable[Result]]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.CREATE_PARTITIONS: self.create_partitions,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.ALTER_CONFIGS: self.alter_configs,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
        }

    def handle(self, request: protocol.Request) -> Result | Awaitable[Result]:
        """Dispatch one request. Raises PymqError for request-level failures."""
        handler = self._table.get(request.api_key)
        if handler is None:
            raise InvalidRequestError(f"unknown api_key {request.api_key}")
        low, high = protocol.SUPPORTED_VERSIONS[ApiKey(request.api_key)]
        if not low <= request.api_version <= high:
            raise UnsupportedVersionError(
                f"{ApiKey(request.api_key).name} version {request.api_version} not in {low}..{high}"
            )
        return handler(request.control, request.payload)

    # -- cluster ---------------------------------------------------------------------------------

    def api_versions(self, control: dict[str, Any], payload: memoryview) -> Result:
        keys = [{"api_key": int(k), "name": k.name, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in protocol.SUPPORTED_VERSIONS.items()]
        return {"error_code": NONE, "api_keys": keys}, []

    def metadata(self, control: dict[str, Any], payload: memoryview) -> Result:
        names = field(control, "topics", list, None)
        host, port = self.advertised()
        topics = []
        for name in (sorted(self.registry.topics) if names is None else names):
            if not isinstance(name, str):
                raise InvalidRequestError("topic names must be strings")
            try:
                info = self.registry.get(name)
            except PymqError as err:
                topics.append({"name": name, **error_fields(err), "partitions": []})
                continue
            partitions = [
                {"partition": p, "error_code": NONE, "leader": s.leader, "leader_epoch": s.leader_epoch,
                 "replicas": list(s.replicas), "isr": list(s.isr)}
                for p, s in sorted(info.partitions.items())
            ]
            topics.append({"name": name, "error_code": NONE, "topic_id": info.topic_id, "partitions": partitions})
        brokers = [{"node_id": self.broker_id, "host": host, "port": port}]
        return {"error_code": NONE, "brokers": brokers, "controller_id": self.broker_id, "topics": topics}, []

    # -- admin -----------------------------------------------------------------------------------

    async def create_topics(self, control: dict[str, Any], payload: memoryview) -> Result:
        validate_only = field(control, "validate_only", bool, False)
        results = []
        for item in entries(control, "topics"):
            name = item.get("name")
            try:
                partitions = field(item, "num_partitions", int, -1)
                if partitions == -1:
                    partitions = self.config["num.partitions"]
                replication = field(item, "replication_factor", int, -1)
                replication = 1 if replication == -1 else replication
                configs = field(item, "configs", dict, {})
                if validate_only:
                    self.registry.validate_new_topic(name, partitions, replication, configs)
                else:
                    info = await self.registry.create(name, partitions, replication, configs)
                    await self._create_logs(info, list(range(partitions)), undo_topic=True)
                    log.info("created topic %s with %d partitions", name, partitions)
                results.append({"name": name, "error_code": NONE})
            except PymqError as err:
                results.append({"name": name, **error_fields(err)})
        return {"error_code": NONE, "topics": results}, []

    async def delete_topics(self, control: dict[str, Any], payload: memoryview) -> Result:
        results = []
        for name in field(control, "topics", list):
            try:
                if not isinstance(name, str):
                    raise InvalidRequestError("topic names must be strings")
                await self.registry.delete(name)
                await self.replicas.delete_topic(name)
                log.info("deleted topic %s", name)
                results.append({"name": name, "error_code": NONE})
            except PymqError as err:
                results.append({"name": name, **error_fields(err)})
        return {"error_code": NONE, "topics": results}, []

    async def create_partitions(self, control: dict[str, Any], payload: memoryview) -> Result:
        validate_only = field(control, "validate_only", bool, False)
        results = []
        for item in entries(control, "topics"):
            name = item.get("name")
            try:
                count = field(item, "count", int)
                if validate_only:
                    self.registry.validate_partition_count(name, count)
                else:
                    added = await self.registry.add_partitions(name, count)
                    await self._create_logs(self.registry.get(name), added, undo_topic=False)
                    log.info("topic %s now has %d partitions", name, count)
                results.append({"name": name, "error_code": NONE})
            except PymqError as err:
                results.append({"name": name, **error_fields(err)})
        return {"error_code": NONE, "topics": results}, []

    async def _create_logs(self, info: TopicInfo, partitions: list[int], undo_topic: bool) -> None:
        """Create and lead the logs of new partitions (all or nothing, off the event loop). If the
        disk refuses a new topic, its metadata goes too, so that the topic either exists whole or
        not at all; partitions added to an existing topic stay in the metadata and their logs are
        created when the broker next loads them."""
        spec = TopicLogSpec(info.topic_id, info.log_config(self.registry.log_defaults), info.partition_count)
        states = {(info.name, p): LeaderAndIsr.of(info.partitions[p]) for p in partitions}
        try:
            await self.replicas.create_partitions(info.name, spec, partitions, states)
        except KafkaStorageError:
            if undo_topic:
                await self.registry.delete(info.name)
            raise

    def describe_configs(self, control: dict[str, Any], payload: memoryview) -> Result:
        results = []
        for name in field(control, "topics", list):
            try:
                info = self.registry.get(name)
                effective = info.log_config(self.registry.log_defaults).to_dotted()
                configs = [
                    {"name": key, "value": value, "source": "topic" if key in info.configs else "broker_default"}
                    for key, value in sorted(effective.items())
                ]
                results.append({"name": name, "error_code": NONE, "configs": configs})
            except PymqError as err:
                results.append({"name": name, **error_fields(err), "configs": []})
        return {"error_code": NONE, "topics": results}, []

    async def alter_configs(self, control: dict[str, Any], payload: memoryview) -> Result:
        """Incremental: each topic names configs to `set` and configs to `delete` (reset to default)."""
        validate_only = field(control, "validate_only", bool, False)
        results = []
        for item in entries(control, "topics"):
            name = item.get("name")
            try:
                set_configs = field(item, "set", dict, {})
                delete = field(item, "delete", list, [])
                if validate_only:
                    self.registry.validate_config_change(name, set_configs, delete)
                else:
                    config = await self.registry.alter_configs(name, set_configs, delete)
                    self.replicas.update_config(name, config)
                    log.info("altered configs of %s: set %s, reset %s", name, set_configs, delete)
                results.append({"name": name, "error_code": NONE})
            except PymqError as err:
                results.append({"name": name, **error_fields(err)})
        return {"error_code": NONE, "topics": results}, []

    # -- data ------------------------------------------------------------------------------------

    def _leader_log(self, topic: Any, partition: Any) -> UnifiedLog:
        """The log of a partition this broker leads; the single seam between handlers and logs."""
        return self.replicas.leader_log(topic, partition)

    def produce(self, control: dict[str, Any], payload: memoryview) -> Result | Awaitable[Result]:
        acks = field(control, "acks", int, 1)
        if acks not in (-1, 0, 1):
            raise InvalidRequiredAcksError(f"acks must be -1, 0 or 1, got {acks}")
        timeout_ms = field(control, "timeout_ms", int, DEFAULT_PRODUCE_TIMEOUT_MS)
        if timeout_ms < 0:
            raise InvalidRequestError(f"timeout_ms must be >= 0, got {timeout_ms}")
        topics = entries(control, "topics")
        slices: list[tuple[str, list[tuple[Any, memoryview]]]] = []
        pos = 0
        for item in topics:
            parts = []
            for p in entries(item, "partitions"):
                size = field(p, "size", int)
                if size < 0 or pos + size > len(payload):
                    raise InvalidRequestError("partition sizes do not match the payload")
                parts.append((p.get("partition"), payload[pos : pos + size]))
                pos += size
            slices.append((item.get("name"), parts))
        if pos != len(payload):
            raise InvalidRequestError(f"payload has {len(payload) - pos} bytes not claimed by any partition")
        results = [(name, [(partition, self._append(name, partition, data, acks, timeout_ms)) for partition, data in parts])
                   for name, parts in slices]
        if any(not isinstance(outcome, dict) for _, parts in results for _, outcome in parts):
            return self._produced_later(acks, results)
        return self._produce_response(acks, results)  # type: ignore[arg-type]

    async def _produced_later(self, acks: int, results: list[tuple[Any, list[tuple[Any, Any]]]]) -> Result:
        """The response to a produce some of whose appends were queued or wait for their ack."""
        done = [(name, [(p, outcome if isinstance(outcome, dict) else await outcome) for p, outcome in parts])
                for name, parts in results]
        return self._produce_response(acks, done)

    @staticmethod
    def _produce_response(acks: int, results: list[tuple[Any, list[tuple[Any, dict[str, Any]]]]]) -> Result:
        if acks == 0:
            return None
        topics = [{"name": name, "partitions": [{"partition": p, **outcome} for p, outcome in parts]}
                  for name, parts in results]
        return {"error_code": NONE, "topics": topics}, []

    def _append(self, topic: Any, partition: Any, data: memoryview, acks: int,
                timeout_ms: int) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """A partition's produce outcome, or a coroutine for it if it must wait."""
        try:
            appended = self.replicas.append(topic, partition, data, acks, timeout_ms)
        except PymqError as err:
            return _append_failed(err)
        if isinstance(appended, AppendInfo):
            return _appended(appended)
        return self._append_later(appended)

    @staticmethod
    async def _append_later(pending: Awaitable[AppendInfo]) -> dict[str, Any]:
        try:
            return _appended(await pending)
        except PymqError as err:
            return _append_failed(err)

    async def fetch(self, control: dict[str, Any], payload: memoryview) -> Result:
        max_wait_ms = min(max(field(control, "max_wait_ms", int, 0), 0), MAX_WAIT_MS_LIMIT)
        min_bytes = max(field(control, "min_bytes", int, 1), 0)
        max_bytes = min(max(field(control, "max_bytes", int, self.config["fetch.max.bytes"]), 1),
                        self.config["fetch.max.bytes"])
        wanted = [
            (item.get("name"), [(p.get("partition"), field(p, "fetch_offset", int), max(field(p, "max_bytes", int, max_bytes), 1))
                                for p in entries(item, "partitions")])
            for item in entries(control, "topics")
        ]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        while True:
            control_out, parts, total, failed = self._read_fetch(wanted, max_bytes)
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or remaining <= 0:
                return control_out, parts
            for part in parts:  # not enough yet: this pass's ranges will not be sent
                part.close()
            await self.replicas.wait_for_data([(t, p) for t, ps in wanted for p, _, _ in ps], remaining)

    def _read_fetch(self, wanted: list[tuple[Any, list[tuple[Any, int, int]]]],
                    max_bytes: int) -> tuple[dict[str, Any], list[FetchSlice], int, bool]:
        """One pass over the requested partitions; the response mirrors the request's entries."""
        topics: list[dict[str, Any]] = []
        parts: list[FetchSlice] = []
        total = 0
        failed = False
        for topic, partitions in wanted:
            entries_out: list[dict[str, Any]] = []
            topics.append({"name": topic, "partitions": entries_out})
            for partition, offset, partition_max in partitions:
                entry, piece = self._read_partition(topic, partition, offset, partition_max, max_bytes - total, total == 0)
                entries_out.append(entry)
                failed = failed or entry["error_code"] != NONE
                if piece is not None:
                    parts.append(piece)
                    total += piece.size
        return {"error_code": NONE, "topics": topics}, parts, total, failed

    def _read_partition(self, topic: Any, partition: Any, offset: int, partition_max: int, budget: int,
                        first: bool) -> tuple[dict[str, Any], FetchSlice | None]:
        """One partition's fetch entry and its bytes; the first partition with data may exceed the
        response budget by one batch (KIP-74) so that a large batch can always be fetched."""
        entry: dict[str, Any] = {"partition": partition, "error_code": NONE, "size": 0}
        try:
            partition_log = self._leader_log(topic, partition)
            entry["high_watermark"] = partition_log.high_watermark
            entry["log_start_offset"] = partition_log.log_start_offset
            limit = min(partition_max, budget)
            if limit <= 0 and not first:
                return entry, None
            piece = partition_log.read(offset, max(limit, 1))
        except PymqError as err:
            entry.update(error_fields(err))
            return entry, None
        if not piece.size:
            piece.close()
            return entry, None
        entry["size"] = piece.size
        return entry, piece

    def list_offsets(self, control: dict[str, Any], payload: memoryview) -> Result:
        results = []
        for item in entries(control, "topics"):
            name = item.get("name")
            partitions = []
            for p in entries(item, "partitions"):
                partition = p.get("partition")
                try:
                    timestamp = field(p, "timestamp", int)
                    offset, found_ts = self._offset_for(self._leader_log(name, partition), timestamp)
                    partitions.append({"partition": partition, "error_code": NONE, "offset": offset, "timestamp": found_ts})
                except PymqError as err:
                    partitions.append({"partition": partition, **error_fields(err), "offset": -1, "timestamp": -1})
            results.append({"name": name, "partitions": partitions})
        return {"error_code": NONE, "topics": results}, []

    @staticmethod
    def _offset_for(partition_log: UnifiedLog, timestamp: int) -> tuple[int, int]:
        if timestamp == protocol.LATEST_TIMESTAMP:
            return partition_log.high_watermark, -1
        if timestamp == protocol.EARLIEST_TIMESTAMP:
            return partition_log.log_start_offset, -1
        if timestamp < 0:
            raise InvalidRequestError(f"timestamp {timestamp} is neither -1, -2 nor a time")
        found = partition_log.offset_for_timestamp(timestamp)
        return found if found is not None else (-1, -1)


def _appended(info: AppendInfo) -> dict[str, Any]:
    return {"error_code": NONE, "base_offset": info.first_offset, "log_append_time": info.log_append_time_ms,
            "log_start_offset": info.log_start_offset}


def unexpected_error(err: BaseException) -> dict[str, Any]:
    """The response fields for a bug: logged with its traceback, reported as UNKNOWN_SERVER_ERROR."""
    log.exception("handler failed", exc_info=err)
    return error_fields(UnknownServerError(f"{type(err).__name__}: {err}"))
