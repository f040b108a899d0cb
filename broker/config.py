"""Broker and topic configuration: definitions, defaults, validation (Kafka's dotted names).

Topic configs (`segment.bytes`, `retention.ms`, ...) are what CreateTopics / AlterConfigs take and
what `LogConfig` carries into the log. Each has a broker-level default under Kafka's broker key
(`log.segment.bytes`, `log.retention.ms`, ...), set in `conf/broker.toml`. Every value is checked
against its type and bounds; a bad one raises InvalidConfigError naming the key.

A limit on everything: the relations between limits are checked too (a batch must fit a segment;
segment positions must fit the int32 relative positions of the offset index).
"""
from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from broker.connection_quotas import parse_overrides
from common.errors import InvalidConfigError
from protocol.messages.metadata import KEY_PARTITIONERS
from segment_format.limits import INT32_MAX, INT64_MAX


@dataclass(frozen=True)
class ConfigDef:
    """One config key: its type, default, bounds and meaning. `normalize`, for a str config,
    maps the spellings a user may type to the one stored and compared (before the choices check)."""

    name: str
    kind: type
    default: Any
    doc: str
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] | None = None
    normalize: Callable[[str], str] | None = None

    def parse(self, value: Any) -> Any:
        """Coerce `value` (a TOML value or a CLI string) and check bounds."""
        try:
            parsed = self._coerce(value)
        except (ValueError, KeyError, TypeError):
            raise InvalidConfigError(f"{self.name}: {value!r} is not a valid {self.kind.__name__}") from None
        if self.minimum is not None and parsed < self.minimum:
            raise InvalidConfigError(f"{self.name}: {parsed} is below the minimum {self.minimum}")
        if self.maximum is not None and parsed > self.maximum:
            raise InvalidConfigError(f"{self.name}: {parsed} is above the maximum {self.maximum}")
        if self.choices is not None and parsed not in self.choices:
            raise InvalidConfigError(f"{self.name}: {parsed!r} is not one of {', '.join(self.choices)}")
        return parsed

    def _coerce(self, value: Any) -> Any:
        """`value` as the config's type; ValueError, KeyError or TypeError if it is not one."""
        if isinstance(value, bool) and self.kind is not bool:
            raise ValueError  # TOML's true is not 1
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if self.kind is float:
            parsed = float(value)  # "0.5", 0.5 and 1 alike
            if not math.isfinite(parsed):
                raise ValueError
            return parsed
        if self.kind is bool:
            return value if isinstance(value, bool) else {"true": True, "false": False}[str(value).lower()]
        if not isinstance(value, str):
            raise ValueError
        return value if self.normalize is None else self.normalize(value)


def normalize_cleanup_policy(value: str) -> str:
    """Kafka's cleanup.policy is a list: "delete,compact", "compact, delete" and "compact,delete"
    all mean both, stored as "compact,delete" (the words sorted, which is Kafka's order). Unknown
    words are left for the choices check to name."""
    return ",".join(sorted({word.strip() for word in value.split(",")}))


CLEANUP_POLICIES = ("delete", "compact", "compact,delete")


# Topic-level configs and the broker key that holds each one's default.
TOPIC_CONFIGS: dict[str, tuple[ConfigDef, str]] = {
    d.name: (d, broker_key)
    for d, broker_key in [
        (ConfigDef("segment.bytes", int, 1 << 30, "roll the active segment at this size", 4096, INT32_MAX), "log.segment.bytes"),
        (ConfigDef("segment.ms", int, 7 * 86_400_000, "roll the active segment after this age", 1, INT64_MAX), "log.roll.ms"),
        (ConfigDef("retention.ms", int, 7 * 86_400_000, "delete segments older than this; -1 keeps forever", -1, INT64_MAX), "log.retention.ms"),
        (ConfigDef("retention.bytes", int, -1, "delete oldest segments while the partition is larger; -1 no limit", -1, INT64_MAX), "log.retention.bytes"),
        (ConfigDef("index.interval.bytes", int, 4096, "bytes between offset/time index entries", 0, INT32_MAX), "log.index.interval.bytes"),
        (ConfigDef("flush.messages", int, INT64_MAX, "fsync after this many messages", 1, INT64_MAX), "log.flush.interval.messages"),
        (ConfigDef("flush.ms", int, INT64_MAX, "fsync when unflushed data is older than this", 0, INT64_MAX), "log.flush.interval.ms"),
        (ConfigDef("max.message.bytes", int, 8 << 20, "largest record batch accepted", 128, INT32_MAX), "message.max.bytes"),
        (ConfigDef("message.timestamp.type", str, "CreateTime", "record timestamps: producer's or broker's", choices=("CreateTime", "LogAppendTime")), "log.message.timestamp.type"),
        (ConfigDef("message.timestamp.before.max.ms", int, INT64_MAX,
                   "CreateTime: refuse a batch whose base_timestamp is more than this before the broker's clock", 0, INT64_MAX),
         "log.message.timestamp.before.max.ms"),
        (ConfigDef("message.timestamp.after.max.ms", int, 3_600_000,
                   "CreateTime: refuse a batch whose max_timestamp is more than this after the broker's clock", 0, INT64_MAX),
         "log.message.timestamp.after.max.ms"),
        (ConfigDef("cleanup.policy", str, "delete",
                   "delete: retention by time/size removes old segments; compact: the log cleaner keeps the latest "
                   "record of each key; compact,delete: both", choices=CLEANUP_POLICIES, normalize=normalize_cleanup_policy),
         "log.cleanup.policy"),
        (ConfigDef("delete.retention.ms", int, 86_400_000,
                   "compacted topics: keep a tombstone (null value) this long after its timestamp, so consumers "
                   "that lag still see the delete", 0, INT64_MAX), "log.cleaner.delete.retention.ms"),
        (ConfigDef("min.cleanable.dirty.ratio", float, 0.5,
                   "compacted topics: clean a log once its uncleaned bytes are this fraction of its cleanable bytes",
                   0.0, 1.0), "log.cleaner.min.cleanable.ratio"),
        (ConfigDef("min.compaction.lag.ms", int, 0,
                   "compacted topics: never clean a record younger than this (by its segment's max timestamp)",
                   0, INT64_MAX), "log.cleaner.min.compaction.lag.ms"),
        (ConfigDef("max.compaction.lag.ms", int, INT64_MAX,
                   "compacted topics: clean a log whatever its dirty ratio once its oldest uncleaned record is this old",
                   1, INT64_MAX), "log.cleaner.max.compaction.lag.ms"),
        # Tiered storage (docs/architecture.md, Tiered storage; Kafka's KIP-405 names). The broker must also have
        # remote.log.storage.system.enable for a topic's remote.storage.enable to take effect.
        (ConfigDef("remote.storage.enable", bool, False,
                   "upload sealed segments to the remote store and let local retention delete the local "
                   "copies once uploaded"), "log.remote.storage.enable"),
        (ConfigDef("local.retention.ms", int, -2,
                   "remote.storage.enable: delete a local segment this long after its newest record, once "
                   "uploaded; -2 uses retention.ms, -1 keeps local copies as long as retention.ms", -2, INT64_MAX),
         "log.local.retention.ms"),
        (ConfigDef("local.retention.bytes", int, -2,
                   "remote.storage.enable: delete the oldest uploaded local segments while the local log is "
                   "larger; -2 uses retention.bytes, -1 no limit", -2, INT64_MAX), "log.local.retention.bytes"),
        # Replication (docs/cluster.md).
        (ConfigDef("min.insync.replicas", int, 1,
                   "acks=all: refuse a produce (NOT_ENOUGH_REPLICAS) while fewer replicas than this are in sync",
                   1, INT32_MAX), "min.insync.replicas"),
        (ConfigDef("unclean.leader.election.enable", bool, False,
                   "when no in-sync replica is alive, make another replica leader: the partition serves again, "
                   "losing what only the in-sync replicas had"), "unclean.leader.election.enable"),
        (ConfigDef("key.partitioner", str, "murmur2",
                   "where producers put a keyed record: murmur2 is Kafka's placement (a key keeps its Kafka "
                   "partition), murmur3 that of topics created before this config; changing it moves keys",
                   choices=KEY_PARTITIONERS), "key.partitioner"),
        (ConfigDef("message.decompressed.max.bytes", int, 64 << 20,
                   "largest body a compressed record batch may decompress to (the leader decompresses and "
                   "validates every producer's batch before storing it; a larger one is MESSAGE_TOO_LARGE)",
                   1024, INT64_MAX), "log.message.decompressed.max.bytes"),
    ]
}


@dataclass(frozen=True)
class LogConfig:
    """The effective configs of one topic's partition logs (python names of the dotted keys)."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 86_400_000
    retention_ms: int = 7 * 86_400_000
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    flush_messages: int = INT64_MAX
    flush_ms: int = INT64_MAX
    max_message_bytes: int = 8 << 20
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_after_max_ms: int = 3_600_000
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = INT64_MAX
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    key_partitioner: str = "murmur2"
    message_decompressed_max_bytes: int = 64 << 20

    @property
    def effective_local_retention_ms(self) -> int:
        """local.retention.ms, or retention.ms where it is -2 (Kafka's rule)."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """local.retention.bytes, or retention.bytes where it is -2 (Kafka's rule)."""
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @property
    def compact(self) -> bool:
        """The log cleaner keeps the latest record of each key (cleanup.policy has compact)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """Retention by retention.ms / retention.bytes applies (cleanup.policy has delete)."""
        return "delete" in self.cleanup_policy.split(",")

    def __post_init__(self) -> None:
        # A batch larger than segment.bytes goes alone into a fresh segment (as in Kafka), so a
        # segment can reach segment.bytes + max.message.bytes: that must fit the offset index's
        # int32 relative positions.
        if self.segment_bytes + self.max_message_bytes > INT32_MAX:
            raise InvalidConfigError(
                f"segment.bytes ({self.segment_bytes}) + max.message.bytes ({self.max_message_bytes}) "
                f"must fit in {INT32_MAX} bytes (the offset index stores 32-bit positions)"
            )
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise InvalidConfigError(
                f"min.compaction.lag.ms ({self.min_compaction_lag_ms}) must not exceed "
                f"max.compaction.lag.ms ({self.max_compaction_lag_ms})"
            )
        # Kafka's rule: the local log is part of the whole log, so it cannot be kept longer.
        for local, whole, name in ((self.local_retention_ms, self.retention_ms, "ms"),
                                   (self.local_retention_bytes, self.retention_bytes, "bytes")):
            if whole != -1 and (local == -1 or local > whole):
                raise InvalidConfigError(
                    f"local.retention.{name} ({local}) must not exceed retention.{name} ({whole})")

    @classmethod
    def from_dotted(cls, values: dict[str, Any], defaults: "LogConfig | None" = None) -> "LogConfig":
        """Overlay dotted topic configs onto `defaults`, validating each key."""
        parsed = parse_topic_configs(values)
        return replace(defaults or cls(), **{k.replace(".", "_"): v for k, v in parsed.items()})

    def to_dotted(self) -> dict[str, Any]:
        """The dotted configs; a bool as Kafka spells it, "true" or "false" (the wire's config
        values are strings and numbers)."""
        return {f.name.replace("_", "."): _dotted_value(getattr(self, f.name)) for f in fields(self)}


def _dotted_value(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


def parse_topic_configs(values: dict[str, Any]) -> dict[str, Any]:
    """Validate a map of dotted topic configs; unknown keys and bad values raise InvalidConfigError."""
    out = {}
    for key, value in values.items():
        if key not in TOPIC_CONFIGS:
            raise InvalidConfigError(f"unknown topic config {key!r}; known: {', '.join(sorted(TOPIC_CONFIGS))}")
        out[key] = TOPIC_CONFIGS[key][0].parse(value)
    return out


BROKER_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("broker.id", int, 0, "this broker's id", 0, INT32_MAX),
        ConfigDef("host", str, "127.0.0.1", "address to listen on"),
        ConfigDef("port", int, 9092, "TCP port to listen on (0 picks a free one)", 0, 65535),
        ConfigDef("metrics.port", int, -1, "serve Prometheus metrics at http://host:port/metrics (-1: off, 0: a free port)",
                  -1, 65535),
        ConfigDef("log.dir", str, "data", "directory holding partition logs and metadata"),
        ConfigDef("num.partitions", int, 1, "partitions of a topic created without a count", 1, 100_000),
        ConfigDef("socket.request.max.bytes", int, 100 << 20, "largest request frame accepted", 1024, INT32_MAX),
        ConfigDef("connections.max.idle.ms", int, 600_000, "close connections idle this long", 100, INT64_MAX),
        ConfigDef("shutdown.drain.timeout.ms", int, 5_000,
                  "on a clean stop, wait this long for the controlled shutdown (leadership handed to other replicas), "
                  "then this long for requests already read to be answered before closing connections",
                  0, 600_000),
        ConfigDef("max.connections", int, 1000, "connections accepted at once", 1, 1_000_000),
        ConfigDef("queued.max.requests", int, 500,
                  "requests in flight per connection (read, and not yet answered or whose answer is not yet sent) "
                  "before reads pause", 1, 100_000),
        ConfigDef("fetch.max.bytes", int, 55 << 20, "largest fetch response", 1024, INT32_MAX),
        ConfigDef("log.retention.check.interval.ms", int, 300_000, "how often retention runs", 10, INT64_MAX),
        ConfigDef("log.flush.scheduler.interval.ms", int, 1000, "how often flush.ms is checked", 10, INT64_MAX),
        ConfigDef("file.delete.delay.ms", int, 60_000, "keep deleted segments' files this long for in-flight reads", 0, INT64_MAX),
        ConfigDef("log.writer.offload.bytes", int, 128 << 10,
                  "produce payloads of a partition this large are appended on the log writer thread", 0, INT32_MAX),
        ConfigDef("log.writer.queued.max.bytes", int, 64 << 20,
                  "payload bytes queued on the log writer before the connections that produce stop being read "
                  "(the others are still served)", 1, INT64_MAX),
        ConfigDef("queued.max.request.bytes", int, 256 << 20,
                  "bytes of requests read and not yet answered, across all connections, before the broker stops "
                  "reading from every connection (one request larger than this is admitted when nothing else "
                  "is queued; a large frame's body is read only once its whole size fits, so partly received "
                  "frames count too, though they stop only their own connection)", 1, INT64_MAX),
        # Bounds on what one client connection may take (broker/connection.py, docs/architecture.md).
        ConfigDef("max.connections.per.ip", int, 500,
                  "connections accepted at once from one client address; more are closed right after accept", 0,
                  1_000_000),
        ConfigDef("max.connections.per.ip.overrides", str, "",
                  "per-address exceptions to max.connections.per.ip, as address:count,address:count (IP addresses)"),
        ConfigDef("request.read.timeout.ms", int, 30_000,
                  "a request must arrive whole within this long from its first byte, or its connection is closed "
                  "(time the broker itself does not read does not count; checked every second)", 100, INT64_MAX),
        ConfigDef("queued.max.response.descriptors", int, 4096,
                  "segment file descriptors held by responses queued and not yet sent, across all connections, "
                  "before the connections with responses queued stop being read", 1, 1_000_000),
        ConfigDef("background.threads", int, 2,
                  "threads of each kind of background disk work (flushes, checkpoints, retention, log "
                  "creation and deletion, metadata writes, group loads): one bounded pool per kind", 1, 1024),
        ConfigDef("background.queue.max.tasks", int, 10_000,
                  "tasks queued on one background pool before its callers wait for room", 1, 1_000_000),
        ConfigDef("log.max.open.files", int, 1024,
                  "segment files kept open at once (least recently used are closed; the broker also raises its RLIMIT_NOFILE)", 16, 1_000_000),
        ConfigDef("log.flush.offset.checkpoint.interval.ms", int, 60_000,
                  "how often the recovery points are checkpointed (also after every flushed segment roll)", 10, INT64_MAX),
        ConfigDef("zero.copy", bool, True, "send fetch data with os.sendfile (either event loop); false reads it into memory first"),
        ConfigDef("event.loop", str, "uvloop", "asyncio event loop", choices=("uvloop", "asyncio")),
        # The log cleaner (broker/log/log_cleaner.py): one background thread for every compacted log.
        ConfigDef("log.cleaner.enable", bool, True, "run the log cleaner, which compacts topics with cleanup.policy=compact"),
        ConfigDef("log.cleaner.dedupe.buffer.size", int, 128 << 20,
                  "memory for the cleaner's offset map (about 128 bytes per distinct key); a log with more "
                  "distinct dirty keys is cleaned in several rounds", 64 << 10, INT64_MAX),
        ConfigDef("log.cleaner.backoff.ms", int, 15_000, "how long the cleaner sleeps when no log needs cleaning",
                  1, INT64_MAX),
        ConfigDef("log.cleaner.io.buffer.size", int, 512 << 10,
                  "the cleaner writes a cleaned segment in runs of this many bytes", 4096, INT32_MAX),
        # The group coordinator and its compacted topic __consumer_offsets (broker/coordinator).
        ConfigDef("offsets.topic.num.partitions", int, 50, "partitions of __consumer_offsets (fixed once it exists)",
                  1, 1000),
        ConfigDef("offsets.topic.segment.bytes", int, 100 << 20, "segment.bytes of __consumer_offsets", 4096, INT32_MAX),
        ConfigDef("offsets.retention.minutes", int, 10_080,
                  "committed offsets of a group with no members expire this long after it emptied", 1, INT32_MAX),
        ConfigDef("offsets.retention.check.interval.ms", int, 600_000, "how often expired committed offsets are removed",
                  1, INT64_MAX),
        ConfigDef("offset.metadata.max.bytes", int, 4096, "largest metadata string of a committed offset", 0, 1 << 20),
        # The transaction coordinator and its compacted topic __transaction_state (broker/coordinator).
        ConfigDef("transaction.state.log.num.partitions", int, 50,
                  "partitions of __transaction_state (fixed once it exists)", 1, 1000),
        ConfigDef("transaction.state.log.segment.bytes", int, 100 << 20, "segment.bytes of __transaction_state",
                  4096, INT32_MAX),
        ConfigDef("transaction.state.log.replication.factor", int, 3,
                  "replicas of __transaction_state (fewer when the cluster has fewer brokers at its creation)", 1, 32),
        ConfigDef("transaction.max.timeout.ms", int, 900_000,
                  "the longest transaction.timeout.ms a producer may ask for", 1, INT32_MAX),
        ConfigDef("transactional.id.expiration.ms", int, 7 * 86_400_000,
                  "a transactional id idle this long (no transaction open) is forgotten", 1, INT32_MAX),
        ConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", int, 3_600_000,
                  "how often expired transactional ids are removed", 1, INT32_MAX),
        ConfigDef("transaction.max.partitions", int, 10_000,
                  "pymq only: the most partitions one transaction may span", 1, 1_000_000),
        ConfigDef("group.min.session.timeout.ms", int, 6000, "smallest session timeout a consumer may ask for",
                  1, INT32_MAX),
        ConfigDef("group.max.session.timeout.ms", int, 1_800_000, "largest session timeout a consumer may ask for",
                  1, INT32_MAX),
        ConfigDef("group.initial.rebalance.delay.ms", int, 3000,
                  "how long a new group waits for more members before its first rebalance", 0, INT32_MAX),
        ConfigDef("group.max.size", int, INT32_MAX, "members a consumer group may have", 1, INT32_MAX),
        # Tiered storage (broker/remote_log/remote_log_manager.py, tiered_storage/).
        ConfigDef("remote.log.storage.system.enable", bool, False,
                  "run the remote log manager: topics with remote.storage.enable tier their sealed segments"),
        ConfigDef("remote.storage.url", str, "",
                  "fsspec URL of the remote store (file:///path, s3://bucket/prefix, ...); empty: "
                  "file://{log.dir}/remote"),
        ConfigDef("remote.storage.s3.endpoint.url", str, "", "s3:// stores: endpoint URL (empty: AWS's)"),
        ConfigDef("remote.storage.s3.access.key", str, "", "s3:// stores: access key id (empty: the environment's)"),
        ConfigDef("remote.storage.s3.secret.key", str, "", "s3:// stores: secret access key (empty: the environment's)"),
        ConfigDef("remote.storage.s3.region", str, "", "s3:// stores: region (empty: the environment's)"),
        ConfigDef("remote.storage.s3.connect.timeout.ms", int, 10_000,
                  "s3:// stores: how long one request waits to connect", 1, INT32_MAX),
        ConfigDef("remote.storage.s3.read.timeout.ms", int, 30_000,
                  "s3:// stores: how long one request waits for the store to answer (a hung store fails "
                  "the tiering run, which retries with backoff)", 1, INT32_MAX),
        ConfigDef("remote.storage.s3.max.attempts", int, 3,
                  "s3:// stores: attempts per request, the first included, before the run fails", 1, 100),
        ConfigDef("remote.log.manager.task.interval.ms", int, 30_000,
                  "how often the remote log manager looks for segments to upload and remote segments to expire",
                  10, INT64_MAX),
        ConfigDef("remote.log.manager.copy.max.bytes.per.second", int, INT64_MAX,
                  "bandwidth of all segment uploads together", 1, INT64_MAX),
        ConfigDef("remote.log.manager.thread.pool.size", int, 2,
                  "segment uploads in flight at once (one per partition at a time)", 1, 1024),
        ConfigDef("remote.log.reader.threads", int, 4,
                  "threads reading remote segments for fetches and offset lookups below the local log start",
                  1, 1024),
        ConfigDef("remote.log.reader.max.pending.tasks", int, 100,
                  "remote reads queued for the reader threads; past it a fetch below the local log start gets a "
                  "retriable error and read-ahead is skipped", 1, 1_000_000),
        ConfigDef("remote.log.reader.cache.size.bytes", int, 256 << 20,
                  "bytes of remote segment chunks and indexes the broker keeps in memory (LRU)", 1 << 20, INT64_MAX),
        ConfigDef("remote.log.reader.chunk.bytes", int, 4 << 20,
                  "size of one cached range of a remote segment (one ranged GET)", 64 << 10, 1 << 30),
        ConfigDef("remote.log.reader.prefetch.chunks", int, 1,
                  "chunks read ahead of a sequential remote reader (0: none)", 0, 64),
        # A cluster (docs/cluster.md): brokers on a shared etcd, replication between them.
        ConfigDef("metadata.store", str, "local",
                  "where cluster metadata lives: local (one broker, a file in log.dir) or etcd (a cluster)",
                  choices=("local", "etcd")),
        ConfigDef("etcd.endpoint", str, "127.0.0.1:2379",
                  "metadata.store=etcd: the etcd cluster's members, host:port[,host:port...] (calls go to one "
                  "at a time, the next when it fails)"),
        ConfigDef("cluster.name", str, "default",
                  "metadata.store=etcd: the cluster's name; its keys live under pymq/{cluster.name}/ in etcd"),
        ConfigDef("broker.rack", str, "", "the rack (or zone) of this broker: replicas of a partition go to "
                  "different racks first"),
        ConfigDef("advertised.host", str, "", "the host clients and other brokers reach this broker at (empty: host)"),
        ConfigDef("advertised.port", int, 0, "the port clients and other brokers reach this broker at (0: port), "
                  "e.g. a proxy's", 0, 65535),
        ConfigDef("broker.session.timeout.ms", int, 6_000,
                  "a broker whose registration is not renewed this long is dead: its partitions get new leaders "
                  "(the TTL of its etcd lease, whole seconds). A hung broker or machine is found so; a crashed "
                  "process at once, by its peers", 1_000, 3_600_000),
        ConfigDef("default.replication.factor", int, 1, "replicas of a topic created without a factor", 1, 32),
        ConfigDef("offsets.topic.replication.factor", int, 3,
                  "replicas of __consumer_offsets (fewer when the cluster has fewer brokers at its creation)", 1, 32),
        ConfigDef("replica.lag.time.max.ms", int, 30_000,
                  "a follower that has not caught up with the leader's log end for this long leaves the ISR",
                  10, INT32_MAX),
        ConfigDef("replica.fetch.wait.max.ms", int, 500, "how long a follower's fetch waits at the leader for data",
                  0, 300_000),
        ConfigDef("replica.fetch.max.bytes", int, 8 << 20, "bytes a follower asks for per partition per fetch",
                  1024, INT32_MAX),
        ConfigDef("replica.fetch.response.max.bytes", int, 32 << 20, "bytes a follower asks for per fetch",
                  1024, INT32_MAX),
        ConfigDef("replica.fetch.backoff.ms", int, 200, "how long a follower waits after a failed fetch", 0, 60_000),
        ConfigDef("replica.throttle.bytes.per.second", int, INT64_MAX,
                  "bandwidth of this broker's followers that are not in sync (catching up, or moved here by a "
                  "reassignment); in-sync followers are never throttled", 1, INT64_MAX),
        ConfigDef("auto.leader.rebalance.enable", bool, True,
                  "the controller moves leadership back to each partition's preferred (first) replica"),
        ConfigDef("leader.imbalance.check.interval.seconds", int, 300,
                  "how often the controller checks for partitions not led by their preferred replica", 1, INT32_MAX),
        ConfigDef("remote.fetch.max.wait.ms", int, 500,
                  "longest a fetch waits for a remote read (beyond its own max wait) before answering without it",
                  1, 300_000),
        # Hostile requests (protocol/messages/limits.py, broker/metrics.py).
        ConfigDef("request.max.elements", int, 500_000,
                  "list items and map entries one request may hold (any depth; a fetched or listed partition "
                  "counts 4-5): more is refused INVALID_REQUEST before any per-element work", 1, INT32_MAX),
        ConfigDef("group.member.metadata.max.bytes", int, 256 << 10,
                  "largest protocol metadata (all its protocols together) a member may join with, and largest "
                  "assignment a leader may give one member", 1024, INT32_MAX),
        ConfigDef("metrics.groups.max", int, 100,
                  "consumer groups given series of their own in the metrics (state, members, lag), those with "
                  "the most lag; 0: none (counts by state are always there)", 0, 100_000),
        ConfigDef("metrics.group.partitions.enable", bool, False,
                  "also a committed offset and a lag series per partition of those groups"),
        ConfigDef("max.partitions", int, 20_000,
                  "partition replicas one broker may host; creating topics, adding partitions or reassigning "
                  "replicas that would put more on any live broker is refused (POLICY_VIOLATION). Internal "
                  "topics are exempt but count",
                  1, 10_000_000),
        # Kafka's default is true; pymq's is false: any client may be hostile, and a typo or a
        # hostile client must not create topics (broker/handlers/metadata.py).
        ConfigDef("auto.create.topics.enable", bool, False,
                  "a Metadata request that allows it (a producer's lookups) creates the unknown topics it "
                  "names, with num.partitions and default.replication.factor, validated as CreateTopics "
                  "(name, internal topics, max.partitions); off: they are UNKNOWN_TOPIC_OR_PARTITION"),
        ConfigDef("auto.create.topics.max.per.request", int, 10,
                  "unknown topics one Metadata request may create (more are refused POLICY_VIOLATION): one "
                  "request cannot hold the admin changes for long", 1, 100_000),
        ConfigDef("producer.id.expiration.ms", int, 86_400_000,
                  "a partition forgets an idempotent producer this long after its last batch's timestamp (checked "
                  "on each retention pass, log.retention.check.interval.ms); a retry after that is appended again",
                  1, INT64_MAX),
        ConfigDef("producer.state.max.producers.per.partition", int, 20_000,
                  "idempotent producers one partition tracks; beyond it the least recently active ones without "
                  "an open transaction are forgotten early (a client forging producer ids cannot grow the state)",
                  100, 10_000_000),
    ]
}
for _d, _broker_key in TOPIC_CONFIGS.values():
    BROKER_CONFIGS[_broker_key] = replace(_d, name=_broker_key)


@dataclass(frozen=True)
class BrokerConfig:
    """Broker settings: flat dotted keys, as in Kafka's server.properties."""

    values: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        if key in self.values:
            return self.values[key]
        return BROKER_CONFIGS[key].default

    @property
    def log_defaults(self) -> LogConfig:
        """Topic config defaults from the broker's `log.*` keys."""
        return LogConfig(**{name.replace(".", "_"): self[broker_key] for name, (_, broker_key) in TOPIC_CONFIGS.items()})

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "BrokerConfig":
        parsed = {}
        for key, value in values.items():
            if key not in BROKER_CONFIGS:
                raise InvalidConfigError(f"unknown broker config {key!r}")
            parsed[key] = BROKER_CONFIGS[key].parse(value)
        config = cls(parsed)
        config.log_defaults  # checks relations between limits at start-up
        if config["message.max.bytes"] + 1024 > config["socket.request.max.bytes"]:
            raise InvalidConfigError("socket.request.max.bytes must exceed message.max.bytes")
        parse_overrides(config["max.connections.per.ip.overrides"])  # names the entry that is not address:count
        if config["group.min.session.timeout.ms"] > config["group.max.session.timeout.ms"]:
            raise InvalidConfigError(
                f"group.min.session.timeout.ms ({config['group.min.session.timeout.ms']}) must not exceed "
                f"group.max.session.timeout.ms ({config['group.max.session.timeout.ms']})")
        return config

    @property
    def remote_storage_url(self) -> str:
        """remote.storage.url, or file://{log.dir}/remote when empty."""
        return self["remote.storage.url"] or f"file://{Path(self['log.dir']).resolve()}/remote"

    @property
    def remote_storage_options(self) -> dict[str, Any]:
        """The options of an s3:// remote store (RemoteSegmentStore.from_url's names); none for
        other URLs (their settings go in the URL or the fsspec configuration)."""
        if not self.remote_storage_url.startswith(("s3://", "s3a://")):
            return {}
        keys = {"endpoint_url": "remote.storage.s3.endpoint.url", "key": "remote.storage.s3.access.key",
                "secret": "remote.storage.s3.secret.key", "region": "remote.storage.s3.region"}
        options: dict[str, Any] = {option: self[key] for option, key in keys.items() if self[key]}
        options["connect_timeout_s"] = self["remote.storage.s3.connect.timeout.ms"] / 1000
        options["read_timeout_s"] = self["remote.storage.s3.read.timeout.ms"] / 1000
        options["max_attempts"] = self["remote.storage.s3.max.attempts"]
        return options

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> "BrokerConfig":
        """Read a TOML file (dotted keys may be nested tables) and apply `overrides`."""
        values: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                values = _flatten(tomllib.load(f))
        values.update(overrides or {})
        return cls.from_mapping(values)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
