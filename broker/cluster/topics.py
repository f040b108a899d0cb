"""TopicRegistry: topics, their partition counts, config overrides and partition state.

The registry is the broker's view of `topics/{name}` and `partitions/{name}/{p}` keys in the
MetadataStore, cached in memory so the produce and fetch paths never touch the store. Every
change is ONE store transaction conditioned on the topic key's version the cache holds: a topic
and all its partition states appear, grow or vanish together (one durable write, one revision,
however many partitions), and a concurrent writer (another broker with the etcd store) makes the
change fail loudly, with nothing written, instead of being lost or half-applied.

New partitions get their replicas from `assign_replicas` over the live brokers; the first
replica leads, every replica starts in the ISR (all logs are empty), leader epoch 0. A partition
state changes afterwards only by a compare-and-set on its key's mod revision
(`alter_partition_state`): the controller's elections and a leader's ISR changes can race, and
the loser re-reads. Changes other brokers make arrive through the metadata listener
(broker/cluster/metadata_listener.py), which applies them with `apply_event`; one this broker
made itself is already in the cache and is recognized by its revision.
"""
from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from broker.cluster.assignment import assign_replicas
from broker.cluster.metadata_store import Compare, Delete, Get, MetadataStore, Put, TxnResult, WatchEvent
from broker.config import TOPIC_CONFIGS, LogConfig, parse_topic_configs
from broker.coordinator.group_records import OFFSETS_TOPIC
from broker.coordinator.transaction_records import TRANSACTION_STATE_TOPIC
from broker.log.log_manager import NAME_MAX
from common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    PolicyViolationError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    VersionConflictError,
)
from protocol.messages.metadata import LEGACY_KEY_PARTITIONER
from segment_format.layout import TOPIC_NAME_MAX, validate_topic_name

MAX_PARTITIONS = 10_000  # per topic: each partition holds open files
# Every creatable partition's directory name fits a file name (its delete name is cut to fit:
# broker/log/log_manager.py delete_dir_name).
assert TOPIC_NAME_MAX + len(f"-{MAX_PARTITIONS - 1}") <= NAME_MAX
NO_LEADER = -1  # a partition no live in-sync replica can lead (offline)
REASSIGN_ATTEMPTS, REASSIGN_RETRY_S = 50, 0.1  # a reassignment racing ISR changes tries again for ~5 s
TOPICS_PREFIX = "topics/"
PARTITIONS_PREFIX = "partitions/"
# Topics the broker writes itself; clients may read them, never produce to, create or delete them.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition's leadership. While a reassignment moves it (KIP-455's model), `replicas` is
    the target replicas followed by those being removed, `adding` the targets that were not
    replicas before, `removing` the replicas that are not targets."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing) if self.adding or self.removing else ()

    @property
    def original_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.adding)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"leader": self.leader, "leader_epoch": self.leader_epoch,
                               "replicas": list(self.replicas), "isr": list(self.isr)}
        if self.adding or self.removing:
            out.update(adding=list(self.adding), removing=list(self.removing))
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "PartitionState":
        return cls(raw["leader"], raw["leader_epoch"], tuple(raw["replicas"]), tuple(raw["isr"]),
                   tuple(raw.get("adding", ())), tuple(raw.get("removing", ())))

    def reassigned(self, target: tuple[int, ...]) -> "PartitionState":
        """This partition moving to `target` (from its original replicas)."""
        original = self.original_replicas
        if target == original:
            return replace(self, replicas=original, isr=tuple(r for r in self.isr if r in original), adding=(), removing=())
        return replace(self, replicas=target + tuple(r for r in original if r not in target),
                       adding=tuple(r for r in target if r not in original),
                       removing=tuple(r for r in original if r not in target))


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partition_count: int
    replication_factor: int
    configs: dict[str, Any]  # overrides only; effective values come from `log_config`
    version: int = 0
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    revisions: dict[int, int] = field(default_factory=dict)  # partition -> mod revision of its state key

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": self.topic_id,
            "partitions": self.partition_count,
            "replication_factor": self.replication_factor,
            "configs": self.configs,
        }

    def log_config(self, defaults: LogConfig) -> LogConfig:
        return LogConfig.from_dotted(self.configs, defaults)


def _topic_key(name: str) -> str:
    return f"{TOPICS_PREFIX}{name}"


def partition_key(name: str, partition: int) -> str:
    return f"{_partitions_prefix(name)}{partition}"


def _partitions_prefix(name: str) -> str:
    return f"{PARTITIONS_PREFIX}{name}/"


@dataclass(frozen=True, slots=True)
class MetadataChange:
    """What one watched event changed in the cache: a topic appeared, changed (configs,
    partition count) or vanished, or one partition's state moved."""

    kind: str  # "topic" | "topic_deleted" | "partition"
    topic: str
    partition: int = -1


class TopicRegistry:
    """Cached, CAS-updated topic metadata for one broker. Not thread-safe: use from the loop."""

    def __init__(self, store: MetadataStore, broker_id: int, log_defaults: LogConfig,
                 live_brokers: Callable[[], Mapping[int, str]] | None = None) -> None:
        self.store = store
        self.broker_id = broker_id
        self.log_defaults = log_defaults
        # broker id -> rack of the live brokers new replicas go to (default: this broker alone)
        self.live_brokers = live_brokers or (lambda: {broker_id: ""})
        self.topics: dict[str, TopicInfo] = {}
        # Told of partition states this broker wrote itself (the watch will not report them as changes).
        self.on_change: Callable[[MetadataChange], None] | None = None
        # Changes are checked and written under one lock: two pipelined admin requests on one
        # topic must not both pass the checks and then race on the compare-and-set.
        self._lock = asyncio.Lock()
        # max.partitions: partition replicas one live broker may host (None: no limit).
        self.max_partitions: int | None = None

    async def load(self) -> int:
        """Read every topic and partition state from the store into the cache, at one revision;
        returns it (a watch from the next one misses nothing)."""
        result = await self.store.txn([], [Get(TOPICS_PREFIX, prefix=True), Get(PARTITIONS_PREFIX, prefix=True)])
        topics, states = result.responses
        self.topics = {}
        for key, versioned in topics.items():  # type: ignore[union-attr]
            info = self._topic_of(key.removeprefix(TOPICS_PREFIX), versioned.value, versioned.version)
            for p in range(info.partition_count):
                state = states.get(partition_key(info.name, p))  # type: ignore[union-attr]
                info.partitions[p] = PartitionState.from_json(state.value) if state else self._initial_state()
                info.revisions[p] = state.mod_revision if state else 0
            self.topics[info.name] = info
        return result.revision

    @staticmethod
    def _topic_of(name: str, raw: dict[str, Any], version: int) -> TopicInfo:
        configs = {"key.partitioner": LEGACY_KEY_PARTITIONER, **raw["configs"]}  # stored before it existed: murmur3
        return TopicInfo(name, raw["topic_id"], raw["partitions"], raw["replication_factor"], configs, version)

    def apply_event(self, event: WatchEvent) -> MetadataChange | None:
        """Bring the cache up to a watched change of a `topics/` or `partitions/` key; None when
        the cache already has it (this broker made the change) or the key is not one of ours."""
        if event.key.startswith(TOPICS_PREFIX):
            name = event.key.removeprefix(TOPICS_PREFIX)
            cached = self.topics.get(name)
            if event.type == "delete":
                if cached is None:
                    return None
                del self.topics[name]
                return MetadataChange("topic_deleted", name)
            info = self._topic_of(name, event.value, event.version)  # type: ignore[arg-type]
            if cached is not None and cached.topic_id == info.topic_id and cached.version >= event.version:
                return None
            if cached is not None and cached.topic_id == info.topic_id:
                info.partitions, info.revisions = cached.partitions, cached.revisions
            self.topics[name] = info
            return MetadataChange("topic", name)
        if event.key.startswith(PARTITIONS_PREFIX) and event.type == "put":
            name, _, number = event.key.removeprefix(PARTITIONS_PREFIX).rpartition("/")
            info = self.topics.get(name)
            if info is None or not number.isdigit():
                return None  # its topic key comes later in the same revision, or it was deleted
            p = int(number)
            if info.revisions.get(p, 0) >= event.revision:
                return None
            info.partitions[p] = PartitionState.from_json(event.value)  # type: ignore[arg-type]
            info.revisions[p] = event.revision
            return MetadataChange("partition", name, p)
        return None

    async def alter_partition_state(self, name: str, partition: int, state: PartitionState,
                                    fence: Sequence[Compare] = ()) -> bool:
        """Replace a partition's state if its key is still at the cached mod revision (and every
        `fence` compare holds); False, with the cache unchanged, if another writer got there
        first (its change arrives through the listener). UnknownTopicOrPartitionError if gone."""
        info = self.get(name)
        if partition not in info.partitions:
            raise UnknownTopicOrPartitionError(f"unknown partition {name}-{partition}")
        key = partition_key(name, partition)
        result = await self.store.txn([Compare.mod_revision(key, "==", info.revisions.get(partition, 0)), *fence],
                                      [Put(key, state.to_json())])
        if not result.succeeded:
            return False
        if self.topics.get(name) is info:
            self.written(name, partition, state, result.revision)
        return True

    async def reassign(self, name: str, partition: int, target: tuple[int, ...] | None,
                       hosted: Counter[int] | None = None) -> None:
        """Start moving a partition to `target` replicas (None: cancel a move in progress, back to
        the original replicas). The controller completes it once every target is in sync.
        INVALID_REPLICA_ASSIGNMENT for an empty or duplicated target or a broker not alive;
        POLICY_VIOLATION if a broker that gains a replica would host more than max.partitions;
        CONCURRENT_METADATA_UPDATE if the state changed meanwhile (retry). `hosted` is what each
        broker hosts (`replica_counts`), counted once for the many moves of one request and
        kept current by each (default: counted for this move alone)."""
        if target is not None:
            live = self.live_brokers()
            if not target or len(set(target)) != len(target):
                raise InvalidReplicaAssignmentError(f"{name}-{partition}: replicas {list(target)} must be distinct broker ids")
            absent = [b for b in target if b not in live]
            if absent:
                raise InvalidReplicaAssignmentError(f"{name}-{partition}: brokers {absent} are not alive")
        for _ in range(REASSIGN_ATTEMPTS):
            state = self.get(name).partitions.get(partition)
            if state is None:
                raise UnknownTopicOrPartitionError(f"unknown partition {name}-{partition}")
            new = state.reassigned(state.original_replicas if target is None else tuple(target))
            # The brokers that gain a replica host it from now on (a move keeps the old ones until done).
            gained = Counter(r for r in new.replicas if r not in state.replicas)
            self._check_replica_limit(gained, f"reassigning {name}-{partition} to "
                                              f"{list(new.target_replicas or new.replicas)}", hosted)
            if new == state or await self.alter_partition_state(name, partition, new):
                if hosted is not None:
                    hosted.update(gained)
                return
            # The leader changed its ISR (or the controller its leader) meanwhile: once the watch
            # brings that state, start again from it.
            await asyncio.sleep(REASSIGN_RETRY_S)
        raise VersionConflictError(f"{name}-{partition} kept changing while being reassigned; retry")

    def written(self, name: str, partition: int, state: PartitionState, revision: int) -> None:
        """A partition state this broker stored at `revision`: into the cache, applied like a
        watched one; unless the watch already brought a newer state of the key (another writer's,
        committed after this one but seen before the store's answer came back). Setting the cache
        back would lose that change for good: the watch does not bring it again."""
        info = self.topics.get(name)
        if info is None or info.revisions.get(partition, 0) >= revision:
            return
        info.partitions[partition], info.revisions[partition] = state, revision
        self.changed(name, partition)

    def changed(self, name: str, partition: int) -> None:
        """A partition state this broker wrote is in the cache: have it applied like a watched one."""
        if self.on_change is not None:
            self.on_change(MetadataChange("partition", name, partition))

    def get(self, name: str) -> TopicInfo:
        if not isinstance(name, str):
            raise InvalidRequestError(f"topic names are strings, got {type(name).__name__}")
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return info

    def log_config(self, name: str) -> LogConfig:
        return self.get(name).log_config(self.log_defaults)

    def validate_new_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, Any]) -> dict[str, Any]:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions}")
        brokers = len(self.live_brokers())
        if not 1 <= replication_factor <= brokers:
            raise InvalidReplicationFactorError(
                f"replication factor {replication_factor} needs that many live brokers; this cluster has {brokers}"
            )
        parsed = parse_topic_configs(configs)
        # Stored with every new topic: a topic stored without it predates it and keeps murmur3.
        parsed.setdefault("key.partitioner", self.log_defaults.key_partitioner)
        LogConfig.from_dotted(parsed, self.log_defaults)  # relations between limits
        return parsed

    async def create(self, name: str, partitions: int, replication_factor: int, configs: dict[str, Any],
                     limited: bool = True) -> TopicInfo:
        """Write the topic key and every partition state in one transaction, only if the topic key
        does not exist in the store (TopicAlreadyExistsError otherwise, nothing written).
        POLICY_VIOLATION past max.partitions unless not `limited` (an internal topic)."""
        async with self._lock:
            parsed = self.validate_new_topic(name, partitions, replication_factor, configs)
            info = TopicInfo(name, uuid.uuid4().hex, partitions, replication_factor, parsed)
            info.partitions = self._new_states(range(partitions), replication_factor)
            if limited:
                self.check_partition_limit(info.partitions, f"creating topic {name!r}")
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", 0)],
                [Put(_topic_key(name), info.to_json()), *self._partition_puts(info, range(partitions))],
                [Get(_topic_key(name))],
            )
            if not result.succeeded:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists (created by another writer)")
            info.version = result.responses[0].version  # type: ignore[union-attr]
            info.revisions = {p: result.revision for p in range(partitions)}
            self.topics[name] = info
            return info

    async def delete(self, name: str) -> TopicInfo:
        """Remove the topic key and every key under its partitions in one transaction, only if the
        topic key still has the cached version (VersionConflictError otherwise, nothing removed)."""
        async with self._lock:
            info = self.get(name)
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", info.version)],
                [Delete(_topic_key(name)), Delete(_partitions_prefix(name), prefix=True)],
                [Get(_topic_key(name))],
            )
            self._raise_if_conflict(name, info, result)
            del self.topics[name]
            return info

    def validate_partition_count(self, name: str, count: int) -> TopicInfo:
        info = self.get(name)
        if count <= info.partition_count:
            raise InvalidPartitionsError(
                f"topic {name!r} has {info.partition_count} partitions; the count can only grow (asked {count})"
            )
        if count > MAX_PARTITIONS:
            raise InvalidPartitionsError(f"partitions must be at most {MAX_PARTITIONS}")
        return info

    async def add_partitions(self, name: str, count: int) -> list[int]:
        """Grow `name` to `count` partitions; returns the new partition numbers. The topic key and
        the new partition states are one transaction on the cached version (VersionConflictError
        otherwise, nothing written)."""
        async with self._lock:
            info = self.validate_partition_count(name, count)
            new = list(range(info.partition_count, count))
            updated = TopicInfo(name, info.topic_id, count, info.replication_factor, info.configs)
            updated.partitions = self._new_states(new, info.replication_factor)
            self.check_partition_limit(updated.partitions, f"adding partitions to {name!r}")
            result = await self.store.txn(
                [Compare.version(_topic_key(name), "==", info.version)],
                [Put(_topic_key(name), updated.to_json()), *self._partition_puts(updated, new)],
                [Get(_topic_key(name))],
            )
            self._raise_if_conflict(name, info, result)
            info.version = result.responses[0].version  # type: ignore[union-attr]
            info.partition_count = count
            info.partitions.update(updated.partitions)
            info.revisions.update({p: result.revision for p in new})
            return new

    def validate_config_change(self, name: str, set_configs: dict[str, Any], delete: list[str]) -> dict[str, Any]:
        """The topic's new overrides after setting `set_configs` and resetting `delete` to defaults."""
        info = self.get(name)
        if not all(isinstance(key, str) for key in delete):
            raise InvalidRequestError("config names to reset must be strings")
        unknown = [key for key in delete if key not in TOPIC_CONFIGS]
        if unknown:
            raise InvalidConfigError(f"unknown topic config {unknown[0]!r}")
        merged = {k: v for k, v in info.configs.items() if k not in delete}
        merged.update(parse_topic_configs(set_configs))
        merged.setdefault("key.partitioner", self.log_defaults.key_partitioner)  # reset: the broker's, stored
        LogConfig.from_dotted(merged, self.log_defaults)
        return merged

    async def alter_configs(self, name: str, set_configs: dict[str, Any], delete: list[str]) -> LogConfig:
        async with self._lock:
            merged = self.validate_config_change(name, set_configs, delete)
            info = self.get(name)
            updated = TopicInfo(name, info.topic_id, info.partition_count, info.replication_factor, merged)
            info.version = await self.store.put(_topic_key(name), updated.to_json(), expected_version=info.version)
            info.configs = merged
            return info.log_config(self.log_defaults)

    def check_partition_limit(self, new: Mapping[int, PartitionState], what: str) -> None:
        """POLICY_VIOLATION if the replicas of `new` partition states would put more than
        max.partitions partition replicas on any broker. What every broker hosts is counted from
        the cached states of every topic (internal ones included): O(partitions), per admin change."""
        self._check_replica_limit(Counter(r for state in new.values() for r in state.replicas), what)

    def replica_counts(self) -> Counter[int]:
        """broker id -> partition replicas it hosts, from the cached states of every topic
        (internal ones included): O(partitions)."""
        return Counter(r for info in self.topics.values() for state in info.partitions.values() for r in state.replicas)

    def _check_replica_limit(self, adding: Counter[int], what: str, hosted: Counter[int] | None = None) -> None:
        """POLICY_VIOLATION if `adding` (broker -> partition replicas it would host in addition)
        takes any broker past max.partitions; `hosted` as `replica_counts` (counted if None)."""
        limit = self.max_partitions
        if limit is None or not adding:
            return
        hosted = self.replica_counts() if hosted is None else hosted
        over = sorted(b for b, n in adding.items() if hosted[b] + n > limit)
        if over:
            b = over[0]
            raise PolicyViolationError(
                f"{what} would put {hosted[b] + adding[b]} partition replicas on broker {b} (it hosts {hosted[b]}); "
                f"max.partitions is {limit}")

    def validate_partition_limit(self, partitions: Iterable[int], replication_factor: int, what: str) -> None:
        """A validate-only request's check_partition_limit, on replicas assigned as a change would."""
        self.check_partition_limit(self._new_states(partitions, replication_factor), what)

    def _initial_state(self) -> PartitionState:
        """The state of a partition stored without one (written before states were): this broker's alone."""
        return PartitionState(self.broker_id, 0, (self.broker_id,), (self.broker_id,))

    def _new_states(self, partitions: Iterable[int], replication_factor: int) -> dict[int, PartitionState]:
        """Replicas spread over the live brokers; the first leads; all in sync; epoch 0."""
        numbers = list(partitions)
        if not numbers:
            return {}
        assigned = assign_replicas(self.live_brokers(), len(numbers), replication_factor, first_partition=numbers[0])
        return {p: PartitionState(replicas[0], 0, replicas, replicas) for p, replicas in assigned.items()}

    @staticmethod
    def _partition_puts(info: TopicInfo, partitions: Iterable[int]) -> list[Put]:
        return [Put(partition_key(info.name, p), info.partitions[p].to_json()) for p in partitions]

    @staticmethod
    def _raise_if_conflict(name: str, info: TopicInfo, result: TxnResult) -> None:
        """A failed compare on the topic key: another writer changed or deleted the topic."""
        if result.succeeded:
            return
        current = result.responses[0].get(_topic_key(name))  # type: ignore[union-attr]
        found = f"version {current.version}" if current else "no topic"
        raise VersionConflictError(f"topic {name!r} changed concurrently: expected version {info.version}, store has {found}")

