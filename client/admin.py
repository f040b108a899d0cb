"""Admin: create, delete and describe topics, add partitions, list offsets, read and alter configs;
list, describe and delete consumer groups, read, alter and delete their committed offsets, and
compute their lag.

Per-topic (per-group) failures are raised as the PymqError their code names, after every topic
(group) in the call was attempted; `AdminError` carries them all when more than one failed.

Group requests go to the group's coordinator, found with FindCoordinator and remembered per
group; NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS and lost
connections make the admin find the coordinator again after `retry_backoff_ms`, until
`request_timeout_ms` has passed since the call began (then the last error is raised).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Iterable, TypeVar

import protocol
from client.cluster import Cluster, PartitionInfo, partition_infos
from client.config import RETRY_BACKOFF_MAX_S, BootstrapServers, client_settings
from client.loop_thread import LoopThread
from client.offset_fetcher import list_offsets
from client.transactions import CoordinatorLink, PreparedTransaction
from common.errors import (
    BrokerNotAvailableError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NetworkError,
    NonEmptyGroupError,
    NotAPymqBrokerError,
    NotCoordinatorError,
    PymqError,
    RebalanceInProgressError,
    RequestTimedOutError,
    UnknownMemberIdError,
    error_for_code,
)
from common.topic_partition import TopicPartition
from protocol import (
    NO_GENERATION_ID,
    NO_LEADER_EPOCH,
    AlterConfigsRequest,
    AlterPartitionReassignmentsRequest,
    ApiVersionsRequest,
    BrokerAddress,
    ConfigChange,
    ConfigValue,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeTieringRequest,
    FindCoordinatorRequest,
    ListGroupsRequest,
    Message,
    MetadataRequest,
    NewTopic,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    Outcome,
    PartitionCount,
    ReassignedPartition,
    ReplaceRemoteSegmentsRequest,
    RequestMessage,
    TieringPartition,
    TopicConfigs,
    TopicMetadata,
    TopicRef,
    TopicRequest,
    TopicResult,
)
from protocol.consumer_protocol import PROTOCOL_TYPE as CONSUMER_PROTOCOL_TYPE
from protocol.consumer_protocol import Assignment
from segment_format.manifest import RemoteSegment

R = TypeVar("R", bound=Message)
log = logging.getLogger("pymq.admin")
# Errors of a broker that could not be reached (down, restarting, not answering in time).
_UNREACHABLE = (NetworkError, BrokerNotAvailableError, RequestTimedOutError)

# The coordinator moved, is starting or is loading: find it again and retry.
_COORDINATOR_RETRIABLE = (NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError)


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: list[PartitionInfo]
    configs: dict[str, dict[str, Any]]  # name -> {"value": ..., "source": "topic" | "broker_default"}


@dataclass(frozen=True)
class ClusterDescription:
    """The brokers serving now, the controller (-1: none), and every partition's leadership:
    `under_replicated` has fewer in-sync replicas than replicas, `offline` no leader."""

    brokers: list[BrokerAddress]
    controller_id: int
    partitions: list[PartitionInfo]

    @property
    def under_replicated(self) -> list[PartitionInfo]:
        return [p for p in self.partitions if p.leader >= 0 and len(p.isr) < len(p.replicas)]

    @property
    def offline(self) -> list[PartitionInfo]:
        return [p for p in self.partitions if p.leader < 0]

    @property
    def reassigning(self) -> list[PartitionInfo]:
        return [p for p in self.partitions if p.target_replicas]


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str  # Empty, PreparingRebalance, CompletingRebalance, Stable
    protocol_type: str  # "consumer" for consumer groups; "" for groups that only have committed offsets


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None  # set for static members
    client_id: str
    assignment: list[TopicPartition]  # decoded for protocol type "consumer", else empty


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str  # the chosen assignor ("" while the group has no generation)
    members: list[MemberDescription]


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int  # the next offset the group will read
    metadata: str | None
    leader_epoch: int | None  # None: not known to the committer


@dataclass(frozen=True)
class PartitionLag:
    """One row of `group_lag`: `committed` None when the group has not committed the partition;
    `log_end_offset` (the high watermark) None when the topic or partition no longer exists;
    `lag` = log_end_offset - committed when both are known; member and client of the member
    the partition is assigned to, if any."""

    topic: str
    partition: int
    committed: int | None
    log_end_offset: int | None
    lag: int | None
    member_id: str | None
    client_id: str | None


@dataclass(frozen=True)
class PartitionTiering:
    """One row of `describe_tiering`, as the partition's leader knows it (fields as
    protocol/messages/tiering.py describes them). Local segments hold
    [local_log_start_offset, log_end_offset); the remote log [remote_log_start_offset,
    remote_log_end_offset) (-1 when not tiered, or its manifest not read yet: `manifest_version`
    -1). Upload lag: offsets and bytes of local segments at or above the remote log end (-1:
    unknown). `failures` tiering runs failed in a row, the last with `last_error`."""

    topic: str
    partition: int
    tiered: bool
    log_start_offset: int
    local_log_start_offset: int
    log_end_offset: int
    high_watermark: int
    local_bytes: int
    remote_log_start_offset: int
    remote_log_end_offset: int
    remote_bytes: int
    remote_segments: int
    manifest_version: int
    upload_lag_offsets: int
    upload_lag_bytes: int
    failures: int
    last_error: str | None

    @classmethod
    def from_message(cls, topic: str, p: TieringPartition) -> "PartitionTiering":
        fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(cls) if f.name != "topic"}
        return cls(topic=topic, **fields)


class AdminError(PymqError):
    """Several topics (or groups) of one admin call failed; `errors` maps each name to its error."""

    def __init__(self, errors: dict[str, PymqError]) -> None:
        super().__init__("; ".join(f"{name}: {err.name()}: {err}" for name, err in errors.items()))
        self.errors = errors


def _raise_topic_errors(topics: Iterable[TopicResult | TopicMetadata | TopicConfigs]) -> None:
    _raise_named_errors({t.name: err for t in topics if (err := t.error()) is not None})


def _raise_named_errors(errors: dict[str, PymqError]) -> None:
    if len(errors) == 1:
        raise next(iter(errors.values()))
    if errors:
        raise AdminError(errors)


def _config_strings(configs: dict[str, Any] | None) -> dict[str, ConfigValue]:
    return {k: str(v) for k, v in (configs or {}).items()}


def _partition_errors(topics: Iterable[Any]) -> None:
    """Raise the first per-partition error of a commit / fetch / delete response."""
    for topic in topics:
        for partition in topic.partitions:
            err = partition.error()
            if err is not None:
                raise err


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in sorted(set(partitions)):
        grouped.setdefault(topic, []).append(partition)
    return grouped


def _assignment(protocol_type: str, data: bytes) -> list[TopicPartition]:
    """A member's partitions: only the consumer protocol's assignment bytes are understood; a
    member that has not synced yet has none."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not data:
        return []
    return list(Assignment.decode(data).partitions)


def _group_description(group: DescribedGroup) -> GroupDescription:
    members = [MemberDescription(m.member_id, m.group_instance_id, m.client_id,
                                 _assignment(group.protocol_type, m.member_assignment)) for m in group.members]
    return GroupDescription(group.group_id, group.group_state, group.protocol_type, group.protocol_data, members)


TRANSACTION_LINKS = 1_024  # transactional ids whose coordinator an admin client remembers


class AsyncAdmin:
    def __init__(self, bootstrap_servers: str | list[str], *, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100, default_api_timeout_ms: int = 60_000,
                 client_id: str = "pymq-admin") -> None:
        self.client_id = client_id
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms)
        self.request_timeout_s = request_timeout_ms / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.default_api_timeout_s = default_api_timeout_ms / 1000
        self._coordinators: dict[str, int] = {}  # group id -> node id of its coordinator
        self._transaction_links: dict[str, CoordinatorLink] = {}  # most recently used last

    async def _reading(self, attempt: Callable[[], Awaitable[R]]) -> R:
        """Run a call that only reads (metadata, configs, offsets) until it succeeds, fails with
        anything but an unreachable broker, or `default_api_timeout_ms` has passed since it
        began, as Kafka's clients do: a broker restarting (connections refused for a few seconds)
        is waited out, not reported. A broker's answer (UNKNOWN_TOPIC_OR_PARTITION, ...) is
        returned at once: the caller decides whether to ask again. Reads are safe to send again;
        changes are not retried here."""
        deadline = time.monotonic() + self.default_api_timeout_s
        backoff = self.retry_backoff_s
        while True:
            try:
                return await attempt()
            except _UNREACHABLE as err:
                if isinstance(err, NotAPymqBrokerError) or time.monotonic() + backoff >= deadline:
                    raise
                log.info("%s: %s; retrying in %.1f s", self.client_id, err, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: dict[str, Any] | None = None, validate_only: bool = False) -> None:
        await self.create_topics([NewTopic(name, partitions, replication_factor, _config_strings(configs))], validate_only)

    async def create_topics(self, topics: list[NewTopic | dict[str, Any]], validate_only: bool = False) -> None:
        """Create several topics; each is a NewTopic or a dict of its fields (name,
        num_partitions, replication_factor, configs)."""
        new = tuple(t if isinstance(t, NewTopic) else NewTopic(**t) for t in topics)
        reply = await self.cluster.send(None, CreateTopicsRequest(new, validate_only))
        _raise_topic_errors(reply.topics)

    async def delete_topics(self, names: Iterable[str]) -> None:
        reply = await self.cluster.send(None, DeleteTopicsRequest(tuple(TopicRef(name) for name in names)))
        _raise_topic_errors(reply.topics)

    async def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        reply = await self.cluster.send(None, CreatePartitionsRequest((PartitionCount(name, count),), validate_only))
        _raise_topic_errors(reply.topics)

    async def list_topics(self) -> list[str]:
        await self._reading(self.cluster.refresh)
        return sorted(self.cluster.topics)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        wanted = list(names) if names is not None else await self.list_topics()
        reply = await self._reading(lambda: self.cluster.send(None, MetadataRequest(tuple(wanted))))
        _raise_topic_errors(reply.topics)
        configs = await self.describe_configs(wanted)
        return [TopicDescription(t.name, t.topic_id, partition_infos(t), configs[t.name]) for t in reply.topics]

    async def alter_partition_reassignments(self, moves: dict[TopicPartition, Iterable[int] | None]) -> None:
        """Move each partition to the given replicas (preferred leader first; None cancels a move
        in progress). Returns once the moves are recorded; they complete as the new replicas catch
        up (`describe_cluster().reassigning`)."""
        by_topic: dict[str, list[ReassignedPartition]] = {}
        for (topic, partition), replicas in moves.items():
            by_topic.setdefault(topic, []).append(
                ReassignedPartition(partition, None if replicas is None else tuple(replicas)))
        request = AlterPartitionReassignmentsRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()))
        reply = await self.cluster.send(None, request)
        _raise_named_errors({f"{t.name}-{p.partition}": err for t in reply.topics for p in t.partitions
                             if (err := p.error()) is not None})

    async def describe_cluster(self) -> ClusterDescription:
        reply = await self._reading(lambda: self.cluster.send(None, MetadataRequest(None)))
        return ClusterDescription(sorted(reply.brokers, key=lambda b: b.node_id), reply.controller_id,
                                  [p for t in reply.topics for p in partition_infos(t)])

    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        request = DescribeConfigsRequest(tuple(TopicRef(name) for name in names))
        reply = await self._reading(lambda: self.cluster.send(None, request))
        _raise_topic_errors(reply.topics)
        return {t.name: {c.name: {"value": c.value, "source": c.source} for c in t.configs} for t in reply.topics}

    async def alter_configs(self, name: str, set_configs: dict[str, Any] | None = None, delete: Iterable[str] = (),
                            validate_only: bool = False) -> None:
        """Set some configs and reset others to the broker default (incremental, like Kafka's
        IncrementalAlterConfigs)."""
        change = ConfigChange(name, _config_strings(set_configs), tuple(delete))
        reply = await self.cluster.send(None, AlterConfigsRequest((change,), validate_only))
        _raise_topic_errors(reply.topics)

    async def list_offsets(self, timestamps: dict[TopicPartition, int],
                           isolation_level: int = protocol.READ_UNCOMMITTED) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition; timestamps may be EARLIEST (-2), LATEST (-1: the last
        stable offset with read_committed, isolation_level 1) or a time in ms."""
        async def attempt() -> dict[TopicPartition, tuple[int, int]]:
            await self.cluster.refresh()
            return await list_offsets(self.cluster, timestamps, isolation_level)

        return await self._reading(attempt)

    async def api_versions(self) -> list[dict[str, Any]]:
        reply = await self.cluster.send(None, ApiVersionsRequest())
        return [dataclasses.asdict(k) for k in reply.api_keys]


    # -- consumer groups ---------------------------------------------------------------------------

    async def find_coordinator(self, group_id: str) -> BrokerAddress:
        """The broker that coordinates `group_id` (retrying while there is none yet, e.g. while
        the broker creates `__consumer_offsets` on first use)."""
        return await self._retrying(lambda: self._find_coordinator(group_id))

    async def _find_coordinator(self, group_id: str) -> BrokerAddress:
        reply = await self.cluster.send(None, FindCoordinatorRequest(group_id))
        err = reply.error()
        if err is not None:
            raise err
        self._coordinators[group_id] = reply.node_id
        return BrokerAddress(reply.node_id, reply.host, reply.port)

    async def _retrying(self, attempt: Callable[[], Awaitable[R]]) -> R:
        """Run `attempt` until it succeeds or fails with an error that finding the coordinator
        again cannot fix, or until request_timeout_ms is spent (then its last error)."""
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            try:
                return await attempt()
            except (*_COORDINATOR_RETRIABLE, NetworkError):
                if time.monotonic() + self.retry_backoff_s >= deadline:
                    raise
            await asyncio.sleep(self.retry_backoff_s)

    async def _send_to_coordinator(self, group_id: str, request: RequestMessage[R],
                                   outcome: Callable[[R], Outcome] | None = None) -> R:
        """Send `request` to the coordinator of `group_id`; the response, once its `outcome`
        (default: the response itself; or the group's entry) names no coordinator error."""

        async def attempt() -> R:
            node = self._coordinators.get(group_id)
            if node is None:
                node = (await self._find_coordinator(group_id)).node_id
            try:
                reply = await self.cluster.send(node, request)
            except NetworkError:
                self._coordinators.pop(group_id, None)
                raise
            err = (outcome(reply) if outcome is not None else reply).error()  # type: ignore[attr-defined]
            if isinstance(err, _COORDINATOR_RETRIABLE):
                self._coordinators.pop(group_id, None)
                raise err
            return reply

        return await self._retrying(attempt)

    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group of every broker, sorted by id; `states` keeps only groups in those
        states (case-insensitive, e.g. "Stable", "Empty")."""
        await self.cluster.refresh([])
        request = ListGroupsRequest(tuple(states or ()))
        replies = await asyncio.gather(*(self.cluster.send(node, request) for node in sorted(self.cluster.brokers)))
        groups: dict[str, GroupListing] = {}
        for reply in replies:
            err = reply.error()
            if err is not None:
                raise err
            for g in reply.groups:
                groups[g.group_id] = GroupListing(g.group_id, g.group_state, g.protocol_type)
        return [groups[g] for g in sorted(groups)]

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """State, protocol and members (with their decoded assignments) of each group, in the
        order asked; GroupIdNotFoundError for an unknown group (AdminError if several fail)."""
        ids = list(dict.fromkeys(group_ids))
        results = await asyncio.gather(*(self._describe_group(g) for g in ids), return_exceptions=True)
        errors = {g: r for g, r in zip(ids, results) if isinstance(r, PymqError)}
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, PymqError):
                raise r
        _raise_named_errors(errors)
        return [r for r in results if isinstance(r, GroupDescription)]

    async def _describe_group(self, group_id: str) -> GroupDescription:
        reply = await self._send_to_coordinator(group_id, DescribeGroupsRequest((group_id,)),
                                                lambda reply: reply.groups[0])
        (group,) = reply.groups
        err = group.error()
        if err is not None:
            raise err
        return _group_description(group)

    async def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups with their committed offsets. Every group is attempted; then the one
        error (NON_EMPTY_GROUP for a group with members, GROUP_ID_NOT_FOUND) is raised, or
        AdminError with every failed group's error when several failed."""
        ids = list(dict.fromkeys(group_ids))
        results = await asyncio.gather(*(self._delete_group(g) for g in ids), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, PymqError):
                raise r
        _raise_named_errors({g: r for g, r in zip(ids, results) if isinstance(r, PymqError)})

    async def _delete_group(self, group_id: str) -> None:
        reply = await self._send_to_coordinator(group_id, DeleteGroupsRequest((group_id,)),
                                                lambda reply: reply.results[0])
        err = reply.results[0].error()
        if err is not None:
            raise err

    async def list_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None
                                 ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (of `partitions`, default all); partitions without a
        committed offset are left out, so an unknown group gives {}."""
        topics = None if partitions is None else tuple(
            TopicRequest(t, tuple(ps)) for t, ps in _by_topic(partitions).items())
        reply = await self._send_to_coordinator(group_id, OffsetFetchRequest(group_id, topics))
        err = reply.error()
        if err is not None:
            raise err
        _partition_errors(reply.topics)
        return {(t.name, p.partition): OffsetAndMetadata(
                    p.committed_offset, p.metadata,
                    None if p.committed_leader_epoch == NO_LEADER_EPOCH else p.committed_leader_epoch)
                for t in reply.topics for p in t.partitions if p.committed_offset >= 0}

    async def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int],
                                  metadata: str | None = None) -> None:
        """Commit `offsets` for the group from outside it (generation -1), creating the group if
        it does not exist. Only while the group has no members: NonEmptyGroupError otherwise.
        The first per-partition error (UNKNOWN_TOPIC_OR_PARTITION, OFFSET_METADATA_TOO_LARGE,
        ...) is raised; the other partitions of the call are committed all the same."""
        by_topic: dict[str, list[OffsetCommitPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(OffsetCommitPartition(partition, offset, NO_LEADER_EPOCH, metadata))
        request = OffsetCommitRequest(group_id, NO_GENERATION_ID, "", None,
                                      tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()))
        reply = await self._send_to_coordinator(group_id, request)
        err = reply.error()
        if isinstance(err, (UnknownMemberIdError, RebalanceInProgressError)):
            # The coordinator's answer to a commit from outside a group that has members.
            raise NonEmptyGroupError(f"group {group_id!r} has active members: its offsets can only be "
                                     f"altered while it is empty ({err.name()}: {err})") from err
        if err is not None:
            raise err
        _partition_errors(reply.topics)

    async def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete the group's committed offsets of `partitions`; GroupIdNotFoundError for an
        unknown group, GroupSubscribedToTopicError (first per-partition error) for a topic its
        members consume."""
        topics = tuple(TopicRequest(t, tuple(ps)) for t, ps in _by_topic(partitions).items())
        reply = await self._send_to_coordinator(group_id, OffsetDeleteRequest(group_id, topics))
        err = reply.error()
        if err is not None:
            raise err
        _partition_errors(reply.topics)

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition of every topic the group has committed offsets for or is assigned:
        committed offset, log end offset (high watermark), lag, and the member it is assigned to,
        sorted by topic and partition. GroupIdNotFoundError for an unknown group."""
        (description,) = await self.describe_groups([group_id])
        committed = await self.list_group_offsets(group_id)
        owners = {tp: m for m in description.members for tp in m.assignment}
        topics = sorted({t for t, _ in committed} | {t for t, _ in owners})
        if topics:
            await self.cluster.refresh(topics)
        existing = {(t, p.partition) for t in topics for p in self.cluster.topics.get(t, [])}
        ends = await list_offsets(self.cluster, {tp: protocol.LATEST_TIMESTAMP for tp in existing}) if existing else {}
        rows = []
        for topic, partition in sorted(existing | committed.keys() | owners.keys()):
            offset = committed.get((topic, partition))
            end = ends.get((topic, partition))
            member = owners.get((topic, partition))
            current = None if offset is None else offset.offset
            rows.append(PartitionLag(topic, partition, current, None if end is None else end[0],
                                     None if current is None or end is None else end[0] - current,
                                     None if member is None else member.member_id,
                                     None if member is None else member.client_id))
        return rows

    # -- tiered storage ----------------------------------------------------------------------------

    async def replace_remote_segments(self, topic: str, partition: int, expected_manifest_version: int,
                                      replaced: Iterable[tuple[int, str]], segments: Iterable[RemoteSegment],
                                      topic_id: str = "") -> int:
        """Ask the partition's leader to swap a run of its remote segments (named by base offset
        and upload id) for `segments`, already uploaded, if its manifest is still at
        `expected_manifest_version`; the new manifest's version. StaleManifestError when it moved
        on (read it again), InvalidRequestError when the segments do not fit it."""
        node = await self.cluster.leader(topic, partition)
        reply = await self.cluster.send(node, ReplaceRemoteSegmentsRequest(
            topic, partition, topic_id, expected_manifest_version, tuple(replaced), tuple(segments)))
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message)
        return reply.manifest_version

    async def describe_tiering(self, topics: Iterable[str] | None = None) -> list[PartitionTiering]:
        """Tiering per partition of `topics` (default: every topic with partitions), asked of
        every broker (each answers for the partitions it leads), sorted by topic and partition.
        An unknown topic raises UnknownTopicOrPartitionError after the others were asked
        (AdminError if several fail); so does a partition's own error."""
        wanted = None if topics is None else tuple(dict.fromkeys(topics))
        await self.cluster.refresh([])
        request = DescribeTieringRequest(wanted)
        replies = await asyncio.gather(*(self.cluster.send(node, request) for node in sorted(self.cluster.brokers)))
        rows: dict[tuple[str, int], PartitionTiering] = {}
        errors: dict[str, PymqError] = {}
        known: set[str] = set()
        for reply in replies:
            for t in reply.topics:
                err = t.error()
                if err is not None:
                    errors.setdefault(t.name, err)
                    continue
                known.add(t.name)
                for p in t.partitions:
                    if (perr := p.error()) is not None:
                        errors.setdefault(f"{t.name}-{p.partition}", perr)
                        continue
                    rows[(t.name, p.partition)] = PartitionTiering.from_message(t.name, p)
        _raise_named_errors({name: err for name, err in errors.items() if name not in known})
        return [rows[key] for key in sorted(rows)]

    # -- transactions ------------------------------------------------------------------------------

    async def complete_transaction(self, prepared: PreparedTransaction, commit: bool) -> None:
        """Commit (or abort) a transaction another client prepared (two-phase commit: the Spark
        driver deciding its executors' transactions). Answers at once for a transaction that
        completed that way already (a retry); ProducerFencedError when a newer instance of the
        transactional id started since (the prepared transaction was aborted then)."""
        link = self._transaction_link(prepared.transactional_id)
        await link.send(lambda: protocol.EndTxnRequest(prepared.transactional_id, prepared.producer_id,
                                                       prepared.producer_epoch, commit), self.request_timeout_s)

    async def describe_transactions(self, transactional_ids: Iterable[str]) -> list[protocol.DescribedTransaction]:
        """State, producer id and epoch, partitions and label of each transactional id, in order;
        an unknown id raises (AdminError if several fail)."""
        ids = list(dict.fromkeys(transactional_ids))
        results = await asyncio.gather(*(self._describe_transaction(t) for t in ids), return_exceptions=True)
        _raise_named_errors({t: r for t, r in zip(ids, results) if isinstance(r, PymqError)})
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)  # type: ignore[arg-type]

    async def _describe_transaction(self, transactional_id: str) -> protocol.DescribedTransaction:
        response = await self._transaction_link(transactional_id).send(
            lambda: protocol.DescribeTransactionsRequest((transactional_id,)), self.request_timeout_s,
            lambda r: r.transactions[0].error())
        return response.transactions[0]

    def _transaction_link(self, transactional_id: str) -> CoordinatorLink:
        """The link to the coordinator of `transactional_id`, kept for the next call: a client
        that describes or completes the same ids again and again (a monitor polling their state,
        an engine's driver deciding each batch) found the coordinator again on every call, a
        FindCoordinator round trip per id per call. A link finds it again when it moves
        (NOT_COORDINATOR). At most TRANSACTION_LINKS kept."""
        link = self._transaction_links.pop(transactional_id, None)
        if link is None:
            link = CoordinatorLink(self.cluster, transactional_id, protocol.TRANSACTION_KEY_TYPE, self.retry_backoff_s)
        self._transaction_links[transactional_id] = link
        if len(self._transaction_links) > TRANSACTION_LINKS:
            del self._transaction_links[next(iter(self._transaction_links))]  # the least recently used
        return link

    async def close(self) -> None:
        await self.cluster.close()


EARLIEST = protocol.EARLIEST_TIMESTAMP
LATEST = protocol.LATEST_TIMESTAMP


class Admin:
    """Synchronous admin client: the AsyncAdmin methods, blocking (each is spelled out, so that a
    misspelt call fails where it is written and every method has its signature and help)."""

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncAdmin.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread(kwargs.get("client_id", "pymq-admin"))
        self._core = AsyncAdmin(bootstrap, **kwargs)

    def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     configs: dict[str, Any] | None = None, validate_only: bool = False) -> None:
        """Create one topic (-1: the broker's default partitions / replication factor)."""
        self._thread.run(self._core.create_topic(name, partitions, replication_factor, configs, validate_only))

    def create_topics(self, topics: list[NewTopic | dict[str, Any]], validate_only: bool = False) -> None:
        """Create several topics (NewTopic or dicts of its fields); AdminError if several fail."""
        self._thread.run(self._core.create_topics(topics, validate_only))

    def delete_topics(self, names: Iterable[str]) -> None:
        self._thread.run(self._core.delete_topics(names))

    def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        """Grow `name` to `count` partitions."""
        self._thread.run(self._core.create_partitions(name, count, validate_only))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._core.list_topics())

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Partitions (leader, replicas, ISR) and effective configs of `names` (default: all)."""
        return self._thread.run(self._core.describe_topics(names))

    def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        return self._thread.run(self._core.describe_configs(names))

    def describe_cluster(self) -> ClusterDescription:
        """Brokers, controller, and the leadership of every partition (under-replicated, offline)."""
        return self._thread.run(self._core.describe_cluster())

    def alter_partition_reassignments(self, moves: dict[TopicPartition, Iterable[int] | None]) -> None:
        """See AsyncAdmin.alter_partition_reassignments."""
        self._thread.run(self._core.alter_partition_reassignments(moves))

    def alter_configs(self, name: str, set_configs: dict[str, Any] | None = None, delete: Iterable[str] = (),
                      validate_only: bool = False) -> None:
        """Set some configs and reset others to the broker default (incremental)."""
        self._thread.run(self._core.alter_configs(name, set_configs, delete, validate_only))

    def list_offsets(self, timestamps: dict[TopicPartition, int],
                     isolation_level: int = protocol.READ_UNCOMMITTED) -> dict[TopicPartition, tuple[int, int]]:
        """(offset, timestamp) per partition for EARLIEST (-2), LATEST (-1; the last stable offset
        with read_committed, isolation_level 1) or a time in ms."""
        return self._thread.run(self._core.list_offsets(timestamps, isolation_level))

    def api_versions(self) -> list[dict[str, Any]]:
        return self._thread.run(self._core.api_versions())

    def find_coordinator(self, group_id: str) -> BrokerAddress:
        """The broker (node_id, host, port) that coordinates `group_id`."""
        return self._thread.run(self._core.find_coordinator(group_id))

    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group, sorted by id; `states` (e.g. ["Stable"]) keeps only groups in those states."""
        return self._thread.run(self._core.list_groups(states))

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """State, protocol and members (with assignments) of each group; GroupIdNotFoundError for
        an unknown one."""
        return self._thread.run(self._core.describe_groups(group_ids))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete empty groups with their offsets; raises the one error (NonEmptyGroupError,
        GroupIdNotFoundError), or AdminError when several groups failed, after trying them all."""
        self._thread.run(self._core.delete_groups(group_ids))

    def list_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None
                           ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets of the group (of `partitions`, default all); uncommitted partitions are left out."""
        return self._thread.run(self._core.list_group_offsets(group_id, partitions))

    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int],
                            metadata: str | None = None) -> None:
        """Commit offsets for a group without members (NonEmptyGroupError otherwise)."""
        self._thread.run(self._core.alter_group_offsets(group_id, offsets, metadata))

    def delete_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete the group's committed offsets of `partitions`."""
        self._thread.run(self._core.delete_group_offsets(group_id, partitions))

    def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Committed offset, log end offset, lag and owning member per partition of the group's topics."""
        return self._thread.run(self._core.group_lag(group_id))

    def replace_remote_segments(self, topic: str, partition: int, expected_manifest_version: int,
                                replaced: Iterable[tuple[int, str]], segments: Iterable[RemoteSegment],
                                topic_id: str = "") -> int:
        """Swap a run of a partition's remote segments for compacted ones (AsyncAdmin's docstring)."""
        return self._thread.run(self._core.replace_remote_segments(topic, partition, expected_manifest_version,
                                                                   replaced, segments, topic_id))

    def describe_tiering(self, topics: Iterable[str] | None = None) -> list[PartitionTiering]:
        """Local and remote ranges, bytes, upload lag and tiering failures per partition of
        `topics` (default: all), sorted; UnknownTopicOrPartitionError for an unknown topic."""
        return self._thread.run(self._core.describe_tiering(topics))

    def complete_transaction(self, prepared: PreparedTransaction, commit: bool) -> None:
        """Commit or abort a transaction another client prepared (AsyncAdmin's docstring)."""
        self._thread.run(self._core.complete_transaction(prepared, commit))

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[protocol.DescribedTransaction]:
        """State, producer id and epoch, partitions and label of each transactional id."""
        return self._thread.run(self._core.describe_transactions(transactional_ids))

    def close(self) -> None:
        """Release connections; calling it again does nothing."""
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._core.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
