"""The `pymq` source's options, parsed and checked once, when the query starts.

Names, forms, defaults and precedence are the Spark Kafka source's, so that a Kafka pipeline moves
to pymq by changing the format name and the bootstrap option:

| option | forms | default | notes |
| --- | --- | --- | --- |
| `bootstrap.servers` / `kafka.bootstrap.servers` | `host:port[,host:port]` | required | |
| `subscribe` / `subscribePattern` / `assign` | comma list / regex / `{"topic":[0,1]}` | exactly one | a pattern is re-evaluated each trigger |
| `startingOffsets` | `earliest`, `latest`, `{"topic":{"0":23,"1":-2}}` | batch `earliest`, stream `latest` | -2 earliest, -1 latest; JSON names every partition |
| `endingOffsets` | `latest`, JSON | `latest` | batch only |
| `startingTimestamp` / `endingTimestamp` | ms since the epoch, every partition | | beat the `*OffsetsByTimestamp` and `*Offsets` options |
| `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp` | `{"topic":{"0":1700000000000}}` | | beat `startingOffsets` / `endingOffsets` |
| `startingOffsetsByTimestampStrategy` | `error`, `latest` | `error` | a partition with no record at or after the time |
| `maxOffsetsPerTrigger`, `minOffsetsPerTrigger` | positive long | | streaming admission control |
| `maxTriggerDelay` | duration (`15m`, `30s`, `500ms`) | `15m` | with `minOffsetsPerTrigger` |
| `minPartitions`, `maxRecordsPerPartition` | positive int | | how ranges split into Spark partitions |
| `failOnDataLoss` | `true`, `false` | `true` | offsets deleted by retention before they were read |
| `includeHeaders` | `true`, `false` | `false` | adds the `headers` column |
| `kafkaConsumer.pollTimeoutMs` | positive long (ms) | `120000` | how long a task retries a fetch that makes no progress (leader not known yet, a broker down) before it fails |
| `kafka.isolation.level` | `read_committed`, `read_uncommitted` | `read_committed` | read_committed: up to each partition's last stable offset, without aborted transactions' records |
| `groupIdForLag` | consumer group id | | streaming: commit each finished batch's end to it (`lag_group.py`) |
| `kafka.<setting>` | client setting | | e.g. `kafka.request.timeout.ms`, `kafka.fetch.max.bytes` |
| `remoteStorage.url` | fsspec URL (`file:///path`, `s3://bucket/prefix`, ...) | | batch: read tiered segments from this store directly (`remote_ranges.py`) |
| `remoteStorage.s3.endpointUrl`, `.accessKey`, `.secretKey`, `.region` | strings | | for an `s3://` store; need `remoteStorage.url` |
| `remoteStorage.only` | `true`, `false` | `false` | batch: read only the tiered history, from the store alone; no broker contacted, bootstrap optional |

Options of Spark's Kafka source that pymq answers differently: `kafka.group.id` and
`groupIdPrefix` are refused (the source joins no group; `groupIdForLag` shows its progress as a
group's lag), `kafka.security.protocol=PLAINTEXT` is accepted (what pymq does) and other values
are not yet supported, `kafka.ssl.*` and
`kafka.sasl.*` are refused (plaintext only, for now); docs/client-settings.md has the list.

`kafka.isolation.level` defaults to read_committed, unlike Spark's Kafka source (read_uncommitted):
a query then never reads a record of a transaction that aborts, nor one still open (`latest` is
each partition's last stable offset), and the offsets that transaction markers and aborted
batches leave empty are simply stepped over (SPARK-23685's failure mode: a range whose last
offsets are markers ends where its last record is, not with an error).

An unknown, malformed or contradictory option raises `InvalidOptionError` naming the option and
what it accepts, before any task runs. Spark hands options over case-insensitively (lower-cased
keys), so lookups here are by lower-cased name.

`groupIdForLag` (not in the Kafka source, which cannot do it: SPARK-27549) makes a streaming
query commit its position, the end of each finished micro-batch, to that consumer group, so that
`pymq group describe GROUP` shows the pipeline's lag. The checkpoint stays the source of truth;
a commit that fails (the group has active members, the broker is unreachable) is logged and the
query goes on. Use a group of its own that no consumer joins. A batch read refuses the option.

`remoteStorage.url` (not in the Kafka source) names the brokers' remote store (docs/architecture.md,
Tiered storage): a batch read then plans the tiered part of each range from the partitions' manifests and its
executors read those segments from the store themselves; only the part not yet tiered is fetched
from brokers. Streaming reads refuse it for now. Remote segments are split like broker ranges
(`maxRecordsPerPartition`, `minPartitions`).

`remoteStorage.only=true` (needs `remoteStorage.url`; batch only) reads the tiered history and
nothing else, with no broker contacted at all, for planning or reading: the bootstrap option is
optional then. The partitions are the store's (`RemoteSegmentStore.partitions`: the numeric
folders under `{root}/{topic}/` holding a manifest; `subscribePattern` matches the topic folders,
`RemoteSegmentStore.topics`); `earliest`/`latest` are each manifest's `log_start_offset` and
`log_end_offset`; JSON offsets are checked against those as against a broker's (an ending
offset past the remote log end is an error; a starting offset below the remote log start is data
loss: failOnDataLoss=true fails, false starts at the remote log start). The `*Timestamp` and
`*OffsetsByTimestamp` options are answered from the remote segments' time indexes as a
broker's ListOffsets would be (`RemoteSegmentStore.offset_for_timestamp`). Records not yet
tiered are not read.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from client.config import check_kafka_only, is_kafka_only
from protocol import ISOLATION_LEVELS, READ_COMMITTED

EARLIEST = -2
LATEST = -1

# Kafka's by-timestamp strategies for a partition without a record at or after the time.
STRATEGY_ERROR = "error"
STRATEGY_LATEST = "latest"

# The Kafka source's default for kafkaConsumer.pollTimeoutMs (Spark's spark.network.timeout).
DEFAULT_POLL_TIMEOUT_MS = 120_000

ISOLATION_OPTION = "kafka.isolation.level"

# Settings a Spark task passes to the pymq client, as Kafka's consumer names (`kafka.` prefix).
CLIENT_SETTINGS = {
    "request.timeout.ms": "request_timeout_ms",
    "fetch.max.bytes": "fetch_max_bytes",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "retry.backoff.ms": "retry_backoff_ms",
    "check.crcs": "check_crcs",
    "default.api.timeout.ms": "default_api_timeout_ms",
}

_SOURCE_OPTIONS = {
    "bootstrap.servers", "kafka.bootstrap.servers", "subscribe", "subscribepattern", "assign",
    "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay", "minpartitions",
    "maxrecordsperpartition", "failondataloss", "includeheaders", "groupidforlag", "remotestorage.url",
    "remotestorage.only", "kafkaconsumer.polltimeoutms",
}
# remoteStorage.s3.* options, as RemoteSegmentStore.from_url's filesystem options.
REMOTE_S3_OPTIONS = {
    "remotestorage.s3.endpointurl": "endpoint_url",
    "remotestorage.s3.accesskey": "key",
    "remotestorage.s3.secretkey": "secret",
    "remotestorage.s3.region": "region",
}
_SOURCE_OPTIONS |= set(REMOTE_S3_OPTIONS)
# The Kafka source's options for the group its consumers use (it never commits to it).
NO_GROUP_OPTIONS = ("kafka.group.id", "groupidprefix")
_SPELLING = {name.lower(): name for name in (
    "subscribePattern", "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
    "maxRecordsPerPartition", "failOnDataLoss", "includeHeaders", "groupIdForLag", "remoteStorage.url",
    "remoteStorage.s3.endpointUrl", "remoteStorage.s3.accessKey", "remoteStorage.s3.secretKey",
    "remoteStorage.s3.region", "remoteStorage.only", "kafkaConsumer.pollTimeoutMs", "groupIdPrefix")}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


class InvalidOptionError(ValueError):
    """An option of the `pymq` source or sink that cannot be used, with what it accepts."""


def bootstrap_servers(opts: Mapping[str, str]) -> str:
    """The brokers, from `kafka.bootstrap.servers` (the Kafka source's name) or `bootstrap.servers`
    (lower-cased option names); both the source and the sink take either."""
    kafka, plain = opts.get("kafka.bootstrap.servers"), opts.get("bootstrap.servers")
    if kafka and plain and kafka.strip() != plain.strip():
        raise InvalidOptionError("options 'kafka.bootstrap.servers' and 'bootstrap.servers' disagree: give one")
    bootstrap = (kafka or plain or "").strip()
    if not bootstrap:
        raise InvalidOptionError("option 'kafka.bootstrap.servers' (or 'bootstrap.servers') is required: "
                                 "'host:port[,host:port...]'")
    return bootstrap


def include_headers(options: Mapping[str, str]) -> bool:
    """The `includeHeaders` option alone: the schema is asked for before the other options are
    checked (Spark calls DataSource.schema first)."""
    return boolean_option({k.lower(): str(v) for k, v in options.items()}, "includeheaders", False)


def spelled(name: str) -> str:
    """An option's name as the documentation writes it (Spark lower-cases the keys)."""
    return _SPELLING.get(name, name)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: one of `earliest`/`latest` for every partition, offsets per
    partition (-2 earliest, -1 latest), or a time: one for every partition or one per partition."""

    kind: str  # "earliest", "latest", "offsets", "timestamp", "timestamps"
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # "offsets" / "timestamps"
    timestamp: int = -1  # "timestamp"
    option: str = ""  # the option it came from, for errors

    @classmethod
    def earliest(cls, option: str = "") -> "OffsetSpec":
        return cls("earliest", option=option)

    @classmethod
    def latest(cls, option: str = "") -> "OffsetSpec":
        return cls("latest", option=option)


@dataclass(frozen=True)
class SourceOptions:
    """Every option of a `pymq` read, checked; the one object planning and tasks work from."""

    bootstrap_servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = field(default_factory=OffsetSpec.earliest)
    ending: OffsetSpec = field(default_factory=OffsetSpec.latest)
    by_timestamp_strategy: str = STRATEGY_ERROR
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS  # a task's bound on retrying a fetch without progress
    group_id_for_lag: str | None = None  # streaming: the group each finished batch's end is committed to
    client: dict[str, Any] = field(default_factory=dict)  # keyword settings for the pymq client
    remote_storage_url: str | None = None  # batch: the remote store tiered segments are read from
    # RemoteSegmentStore.from_url's filesystem options (may hold a secret key: kept out of repr)
    remote_storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    remote_storage_only: bool = False  # batch: plan and read from the store alone, never a broker
    isolation_level: int = READ_COMMITTED  # Fetch/ListOffsets isolation (kafka.isolation.level)

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> "SourceOptions":
        """Check `options` for a batch (`streaming=False`) or streaming read."""
        opts = {k.lower(): str(v) for k, v in options.items()}
        client: dict[str, Any] = {}
        for name in sorted(opts):
            if name in _SOURCE_OPTIONS or name == "path":
                continue
            setting = name.removeprefix("kafka.")
            if name == ISOLATION_OPTION:
                continue
            if name.startswith("kafka.") and setting in CLIENT_SETTINGS:
                client[CLIENT_SETTINGS[setting]] = _client_value(name, opts[name])
                continue
            if name in NO_GROUP_OPTIONS:
                raise InvalidOptionError(f"option {spelled(name)!r}: the pymq source reads partitions by offset and "
                                         "joins no consumer group; to follow a query's progress as a group's lag, "
                                         "use groupIdForLag")
            if name.startswith("kafka.") and is_kafka_only(setting):
                try:
                    check_kafka_only(setting, opts[name])
                except ValueError as err:
                    raise InvalidOptionError(f"option {name!r}: {err}") from None
                continue
            accepted = ", ".join(sorted(spelled(n) for n in _SOURCE_OPTIONS))
            kafka = ", ".join(f"kafka.{s}" for s in CLIENT_SETTINGS)
            raise InvalidOptionError(f"unknown option {name!r} for format pymq; accepted: {accepted}, and {kafka}")
        if opts.get("path"):
            raise InvalidOptionError("option 'path' (load(path)) is not used by format pymq: name topics with "
                                     "subscribe, subscribePattern or assign")

        remote_url, remote_options, remote_only = _remote_storage(opts, streaming)
        given_bootstrap = any(opts.get(n, "").strip() for n in ("kafka.bootstrap.servers", "bootstrap.servers"))
        # remoteStorage.only contacts no broker: the bootstrap option is optional (checked if given).
        bootstrap = bootstrap_servers(opts) if given_bootstrap or not remote_only else ""

        strategies = [n for n in ("assign", "subscribe", "subscribepattern") if n in opts]
        if len(strategies) != 1:
            given = ", ".join(spelled(n) for n in strategies) or "none"
            raise InvalidOptionError("exactly one of the options 'subscribe' (comma-separated topics), "
                                     "'subscribePattern' (a Java/Python regex) or 'assign' "
                                     f"(JSON, e.g. {{\"topicA\":[0,1]}}) is required; given: {given}")
        subscribe: tuple[str, ...] = ()
        pattern = None
        assign = None
        if "subscribe" in opts:
            # A topic named twice is subscribed once (as by a Kafka consumer), not read twice.
            subscribe = tuple(dict.fromkeys(t.strip() for t in opts["subscribe"].split(",") if t.strip()))
            if not subscribe:
                raise InvalidOptionError("option 'subscribe' needs at least one topic: 'topicA,topicB'")
        elif "subscribepattern" in opts:
            pattern = opts["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as err:
                raise InvalidOptionError(f"option 'subscribePattern' is not a valid regex ({err}): {pattern!r}") from err
            if not pattern.strip():
                raise InvalidOptionError("option 'subscribePattern' must not be empty")
        else:
            assign = _parse_assign(opts["assign"])

        starting = _offset_spec(opts, "starting", streaming)
        ending = _offset_spec(opts, "ending", streaming)
        strategy = opts.get("startingoffsetsbytimestampstrategy", STRATEGY_ERROR).strip().lower()
        if strategy not in (STRATEGY_ERROR, STRATEGY_LATEST):
            raise InvalidOptionError(f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', "
                                     f"not {opts['startingoffsetsbytimestampstrategy']!r}")
        _check_partitions_named(starting, assign)
        _check_partitions_named(ending, assign)

        max_per_trigger = _positive(opts, "maxoffsetspertrigger")
        min_per_trigger = _positive(opts, "minoffsetspertrigger")
        if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
            raise InvalidOptionError(f"option 'minOffsetsPerTrigger' ({min_per_trigger}) must not exceed "
                                     f"'maxOffsetsPerTrigger' ({max_per_trigger})")
        delay = _duration_ms(opts, "maxtriggerdelay", 15 * 60_000)
        lag_group = _lag_group(opts, streaming)
        return cls(
            bootstrap_servers=bootstrap,
            subscribe=subscribe,
            subscribe_pattern=pattern,
            assign=assign,
            starting=starting,
            ending=ending,
            by_timestamp_strategy=strategy,
            max_offsets_per_trigger=max_per_trigger,
            min_offsets_per_trigger=min_per_trigger,
            max_trigger_delay_ms=delay,
            min_partitions=_positive(opts, "minpartitions"),
            max_records_per_partition=_positive(opts, "maxrecordsperpartition"),
            fail_on_data_loss=boolean_option(opts, "failondataloss", True),
            include_headers=boolean_option(opts, "includeheaders", False),
            poll_timeout_ms=_positive(opts, "kafkaconsumer.polltimeoutms") or DEFAULT_POLL_TIMEOUT_MS,
            group_id_for_lag=lag_group,
            client=client,
            remote_storage_url=remote_url,
            remote_storage_options=remote_options,
            remote_storage_only=remote_only,
            isolation_level=_isolation_level(opts),
        )

    def topic_matches(self, topic: str) -> bool:
        """Whether `topic` is read by this query's subscription."""
        if self.subscribe:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return self.assign is not None and topic in self.assign


def _isolation_level(opts: dict[str, str]) -> int:
    text = opts.get(ISOLATION_OPTION, "read_committed").strip().lower()
    if text not in ISOLATION_LEVELS:
        raise InvalidOptionError(f"option 'kafka.isolation.level' must be 'read_committed' or 'read_uncommitted', "
                                 f"not {opts[ISOLATION_OPTION]!r}")
    return ISOLATION_LEVELS[text]


def _parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    example = '{"topicA":[0,1],"topicB":[2,4]}'
    value = _json_object("assign", text, "topics to partition lists", example)
    assign = {}
    for topic, partitions in value.items():
        if (not isinstance(partitions, list) or not partitions
                or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions)):
            raise InvalidOptionError(f"option 'assign': topic {topic!r} needs a non-empty list of partition "
                                     f"numbers (>= 0), like {example}")
        assign[topic] = tuple(sorted(set(partitions)))
    return assign


def _offset_spec(opts: dict[str, str], side: str, streaming: bool) -> OffsetSpec:
    """The starting or ending spec, by Kafka's precedence: `<side>Timestamp`, then
    `<side>OffsetsByTimestamp`, then `<side>Offsets`."""
    names = [f"{side}timestamp", f"{side}offsetsbytimestamp", f"{side}offsets"]
    if side == "ending" and streaming:
        given = [spelled(n) for n in names if n in opts]
        if given:
            raise InvalidOptionError(f"option {given[0]!r} is for batch queries only: a streaming query has no end "
                                     "(use Trigger.AvailableNow to stop at the latest offsets)")
        return OffsetSpec.latest()
    timestamp_name, by_timestamp_name, offsets_name = names
    if timestamp_name in opts:
        return OffsetSpec("timestamp", timestamp=_timestamp(spelled(timestamp_name), opts[timestamp_name]),
                          option=spelled(timestamp_name))
    if by_timestamp_name in opts:
        offsets = _partition_json(spelled(by_timestamp_name), opts[by_timestamp_name], "a time in ms since the epoch",
                                  minimum=0)
        return OffsetSpec("timestamps", offsets=offsets, option=spelled(by_timestamp_name))
    option = spelled(offsets_name)
    text = opts.get(offsets_name)
    if text is None:
        return OffsetSpec.latest(option) if side == "ending" or streaming else OffsetSpec.earliest(option)
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        if side == "starting" and word == "latest" and not streaming:
            raise InvalidOptionError("option 'startingOffsets' cannot be 'latest' for a batch query (it would read "
                                     "nothing); use 'earliest' or JSON offsets")
        if side == "ending" and word == "earliest":
            raise InvalidOptionError("option 'endingOffsets' cannot be 'earliest' (it would read nothing); "
                                     "use 'latest' or JSON offsets")
        return OffsetSpec(word, option=option)
    if not word.startswith("{"):
        words = "'latest'" if side == "ending" else "'earliest', 'latest'"
        raise InvalidOptionError(f"option {option!r} must be {words} or JSON offsets like "
                                 f"{{\"topicA\":{{\"0\":23,\"1\":-2}}}}, not {text!r}")
    offsets = _partition_json(option, text, "an offset, -2 (earliest) or -1 (latest)", minimum=EARLIEST)
    for topic, partitions in offsets.items():
        for partition, offset in partitions.items():
            if side == "starting" and offset == LATEST and not streaming:
                raise InvalidOptionError(f"option 'startingOffsets': {topic}-{partition} is -1 (latest), which a "
                                         "batch query cannot start from")
            if side == "ending" and offset == EARLIEST:
                raise InvalidOptionError(f"option 'endingOffsets': {topic}-{partition} is -2 (earliest), which a "
                                         "batch query cannot end at")
    return OffsetSpec("offsets", offsets=offsets, option=option)


def _partition_json(option: str, text: str, what: str, minimum: int) -> dict[str, dict[int, int]]:
    example = '{"topicA":{"0":23,"1":-2},"topicB":{"0":-1}}'
    value = _json_object(option, text, "topics to {partition: value}", example)
    parsed: dict[str, dict[int, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict) or not partitions:
            raise InvalidOptionError(f"option {option!r}: topic {topic!r} needs an object of partition -> {what}")
        parsed[topic] = {}
        for partition, number in partitions.items():
            try:
                p = int(partition)
            except ValueError:
                raise InvalidOptionError(f"option {option!r}: {partition!r} of topic {topic!r} is not a "
                                         "partition number") from None
            if p < 0 or not isinstance(number, int) or isinstance(number, bool) or number < minimum:
                raise InvalidOptionError(f"option {option!r}: {topic}-{partition} must be {what}, not {number!r}")
            parsed[topic][p] = number
    return parsed


def _json_object(option: str, text: str, what: str, example: str) -> dict[str, Any]:
    """`text` as a non-empty JSON object, or an error naming the option and showing an example."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidOptionError(f"option {option!r} must be JSON like {example}: {err}") from err
    if not isinstance(value, dict) or not value:
        raise InvalidOptionError(f"option {option!r} must be a JSON object of {what}, like {example}")
    return value


def _check_partitions_named(spec: OffsetSpec, assign: dict[str, tuple[int, ...]] | None) -> None:
    """With `assign`, per-partition JSON must name exactly the assigned partitions (Kafka's rule:
    a partition left out would be read from an undefined place)."""
    if assign is None or spec.kind not in ("offsets", "timestamps"):
        return
    named = {(t, p) for t, ps in spec.offsets.items() for p in ps}
    assigned = {(t, p) for t, ps in assign.items() for p in ps}
    if named != assigned:
        raise InvalidOptionError(f"option {spec.option!r} must give every assigned partition and no other: "
                                 f"given {sorted(named)}, assigned {sorted(assigned)}")


def _lag_group(opts: dict[str, str], streaming: bool) -> str | None:
    text = opts.get("groupidforlag")
    if text is None:
        return None
    if not streaming:
        raise InvalidOptionError("option 'groupIdForLag' is for streaming queries only: it commits the end of each "
                                 "finished micro-batch to a consumer group, and a batch read has no micro-batches")
    group = text.strip()
    if not group:
        raise InvalidOptionError(f"option 'groupIdForLag' must name a consumer group (a non-empty string), not {text!r}")
    return group


def _remote_storage(opts: dict[str, str], streaming: bool) -> tuple[str | None, dict[str, str], bool]:
    """`remoteStorage.url`, its S3 settings and `remoteStorage.only` (batch reads only, for now)."""
    url = opts.get("remotestorage.url")
    s3 = {setting: opts[name].strip() for name, setting in REMOTE_S3_OPTIONS.items() if name in opts}
    if "remotestorage.only" in opts and streaming:
        raise InvalidOptionError("option 'remoteStorage.only' is for batch queries only: a streaming query reads "
                                 "new records, which only the brokers have")
    only = boolean_option(opts, "remotestorage.only", False)
    if url is None:
        if s3 or only:
            given = next(spelled(n) for n in (*REMOTE_S3_OPTIONS, "remotestorage.only") if n in opts)
            raise InvalidOptionError(f"option {given!r} needs 'remoteStorage.url' (the store it is for)")
        return None, {}, False
    if streaming:
        raise InvalidOptionError("option 'remoteStorage.url' is for batch queries only (for now): a streaming query "
                                 "reads through the brokers, which serve tiered offsets themselves")
    url = url.strip()
    if not url:
        raise InvalidOptionError("option 'remoteStorage.url' must be a store URL like 'file:///data/pymq-remote' or "
                                 "'s3://bucket/prefix', not an empty string")
    if s3 and not url.startswith(("s3://", "s3a://")):
        given = next(spelled(n) for n in REMOTE_S3_OPTIONS if n in opts)
        raise InvalidOptionError(f"option {given!r} is for an s3:// store; 'remoteStorage.url' is {url!r}")
    return url, s3, only


def _timestamp(option: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidOptionError(f"option {option!r} must be a time in milliseconds since the epoch, "
                                 f"not {text!r}") from None
    if value < 0:
        raise InvalidOptionError(f"option {option!r} must be a time in milliseconds since the epoch (>= 0), not {value}")
    return value


def _positive(opts: dict[str, str], name: str) -> int | None:
    text = opts.get(name)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidOptionError(f"option {spelled(name)!r} must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise InvalidOptionError(f"option {spelled(name)!r} must be a positive integer, not {value}")
    return value


def boolean_option(opts: dict[str, str], name: str, default: bool) -> bool:
    """`opts[name]` (lower-cased names) as `true` or `false`, any case; `default` when absent."""
    text = opts.get(name)
    if text is None:
        return default
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise InvalidOptionError(f"option {spelled(name)!r} must be 'true' or 'false', not {text!r}")
    return word == "true"


def _duration_ms(opts: dict[str, str], name: str, default: int) -> int:
    text = opts.get(name)
    if text is None:
        return default
    found = _DURATION.match(text)
    if not found:
        raise InvalidOptionError(f"option {spelled(name)!r} must be a duration like '15m', '30s' or '500ms', "
                                 f"not {text!r}")
    return int(found.group(1)) * _DURATION_MS[(found.group(2) or "ms").lower()]


def _client_value(name: str, text: str) -> Any:
    if name == "kafka.check.crcs":
        return boolean_option({name: text}, name, True)
    return _positive({name: text}, name)
