"""Broker and topic configuration (broker/config.py): parsing, bounds, relations between limits,
TOML loading and topic-name rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BROKER_CONFIGS, TOPIC_CONFIGS, BrokerConfig, ConfigDef, LogConfig, parse_topic_configs
from segment_format.layout import TOPIC_NAME_MAX, validate_topic_name
from segment_format.limits import INT32_MAX, INT64_MAX
from common.errors import InvalidConfigError, InvalidTopicError

INT_DEF = ConfigDef("test.bytes", int, 10, "an int", minimum=1, maximum=100)
FLOAT_DEF = ConfigDef("test.ratio", float, 0.5, "a float", minimum=0.0, maximum=1.0)
BOOL_DEF = ConfigDef("test.enable", bool, False, "a bool")
CHOICE_DEF = ConfigDef("test.mode", str, "a", "a choice", choices=("a", "b"))


# -- ConfigDef ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "definition, raw, expected",
    [
        (INT_DEF, "42", 42),
        (INT_DEF, 42, 42),
        (INT_DEF, 42.0, 42),
        (INT_DEF, "1", 1),
        (INT_DEF, "100", 100),
        (BOOL_DEF, "true", True),
        (BOOL_DEF, "FALSE", False),
        (BOOL_DEF, "True", True),
        (BOOL_DEF, True, True),
        (CHOICE_DEF, "b", "b"),
        (ConfigDef("test.name", str, "", "free text"), "anything at all", "anything at all"),
        (FLOAT_DEF, "0.25", 0.25),
        (FLOAT_DEF, 0.75, 0.75),
        (FLOAT_DEF, 1, 1.0),
        (FLOAT_DEF, "0", 0.0),
    ],
    ids=["int_str", "int", "int_valued_float", "int_minimum", "int_maximum", "bool_true", "bool_upper_false",
         "bool_title", "bool_native", "choice", "free_str", "float_str", "float", "float_from_int", "float_minimum"],
)
def test_parse_coerces_strings_and_native_values(definition, raw, expected):
    """parse turns CLI strings and TOML values into the config's type, bounds inclusive."""
    parsed = definition.parse(raw)
    assert parsed == expected and type(parsed) is type(expected)


@pytest.mark.parametrize(
    "definition, raw, match",
    [
        (INT_DEF, "0", "minimum"),
        (INT_DEF, "101", "maximum"),
        (INT_DEF, "ten", "not a valid int"),
        (INT_DEF, "1.5", "not a valid int"),
        (INT_DEF, 1.5, "not a valid int"),
        (INT_DEF, True, "not a valid int"),
        (INT_DEF, None, "not a valid int"),
        (BOOL_DEF, "yes", "not a valid bool"),
        (BOOL_DEF, "1", "not a valid bool"),
        (CHOICE_DEF, "c", "not one of"),
        (FLOAT_DEF, "1.5", "maximum"),
        (FLOAT_DEF, -0.1, "minimum"),
        (FLOAT_DEF, "half", "not a valid float"),
        (FLOAT_DEF, "nan", "not a valid float"),
        (FLOAT_DEF, float("inf"), "not a valid float"),
        (FLOAT_DEF, True, "not a valid float"),
        (FLOAT_DEF, None, "not a valid float"),
    ],
    ids=["below_min", "above_max", "word_as_int", "decimal_str", "fraction", "bool_as_int", "none_as_int",
         "yes_as_bool", "one_as_bool", "bad_choice", "float_above_max", "float_below_min", "word_as_float",
         "nan", "infinity", "bool_as_float", "none_as_float"],
)
def test_parse_rejects_bad_values_naming_the_key(definition, raw, match):
    """A value of the wrong type, out of bounds or not among the choices raises INVALID_CONFIG naming the key."""
    with pytest.raises(InvalidConfigError, match=match) as info:
        definition.parse(raw)
    assert definition.name in str(info.value)


def test_str_config_rejects_a_toml_array():
    """A str config given a list (a TOML array) raises INVALID_CONFIG instead of stringifying it."""
    with pytest.raises(InvalidConfigError):
        BROKER_CONFIGS["log.dir"].parse(["a", "b"])


def test_every_topic_config_default_parses_and_has_a_broker_key():
    """Each topic config's default passes its own checks, and its broker-level key exists too."""
    for name, (definition, broker_key) in TOPIC_CONFIGS.items():
        assert definition.parse(definition.default) == definition.default
        assert BROKER_CONFIGS[broker_key].default == definition.default
        assert BROKER_CONFIGS[broker_key].name == broker_key


# -- topic configs --------------------------------------------------------------------------------


def test_unknown_topic_config_is_rejected():
    """A dotted key that is not a topic config raises INVALID_CONFIG naming it."""
    with pytest.raises(InvalidConfigError, match="log.segment.bytes"):
        parse_topic_configs({"log.segment.bytes": "4096"})  # a broker key, not a topic key


def test_from_dotted_overlays_parsed_values_on_defaults():
    """from_dotted parses string values and keeps every other field from the given defaults."""
    defaults = LogConfig(retention_ms=1_000, segment_bytes=1 << 20, max_message_bytes=1 << 16)
    config = LogConfig.from_dotted({"segment.bytes": "65536", "message.timestamp.type": "LogAppendTime"}, defaults)
    assert config.segment_bytes == 65536
    assert config.message_timestamp_type == "LogAppendTime"
    assert config.retention_ms == 1_000
    assert config.max_message_bytes == 1 << 16


def test_from_dotted_without_defaults_uses_class_defaults():
    """With no defaults given, unspecified fields take LogConfig's built-in values."""
    config = LogConfig.from_dotted({"retention.ms": -1})
    assert config == LogConfig(retention_ms=-1)


def test_to_dotted_round_trips_through_from_dotted():
    """to_dotted yields exactly the topic config keys, and feeding them back gives the same config."""
    config = LogConfig(segment_bytes=8192, max_message_bytes=4096, retention_bytes=10)
    dotted = config.to_dotted()
    assert set(dotted) == set(TOPIC_CONFIGS)
    assert LogConfig.from_dotted(dotted) == config


def test_segment_plus_largest_batch_must_fit_32_bit_positions():
    """segment.bytes + max.message.bytes beyond 2^31-1 raises INVALID_CONFIG; a batch bigger than a segment is fine."""
    with pytest.raises(InvalidConfigError, match="32-bit positions"):
        LogConfig(segment_bytes=2**31 - 1, max_message_bytes=4096)
    assert LogConfig.from_dotted({"segment.bytes": 4096}).max_message_bytes == 8 << 20


@pytest.mark.parametrize(
    "values",
    [{"segment.bytes": 4095}, {"segment.bytes": INT32_MAX + 1}, {"retention.ms": -2}, {"cleanup.policy": "shred"},
     {"cleanup.policy": "compact,shred"}, {"cleanup.policy": ""}, {"message.timestamp.type": "createtime"},
     {"min.cleanable.dirty.ratio": 1.01}, {"delete.retention.ms": -1}, {"max.compaction.lag.ms": 0}],
    ids=["segment_below_min", "segment_over_int32", "retention_below_minus_one", "unknown_policy",
         "unknown_policy_in_list", "empty_policy", "timestamp_type_case", "ratio_above_one",
         "negative_delete_retention", "zero_max_compaction_lag"],
)
def test_out_of_range_topic_configs_are_rejected(values):
    """Topic configs outside their bounds or choices raise INVALID_CONFIG."""
    with pytest.raises(InvalidConfigError):
        LogConfig.from_dotted(values)


# -- broker config --------------------------------------------------------------------------------


def test_broker_config_load_reads_nested_dotted_toml_keys(tmp_path):
    """Bare dotted keys (nested tables to TOML) and quoted dotted keys flatten to Kafka's names."""
    path = tmp_path / "broker.toml"
    path.write_text(
        'broker.id = 3\n'
        'port = 0\n'
        'message.max.bytes = 4096\n'
        'log.segment.bytes = 8192\n'
        'log.dir = "/tmp/pymq-data"\n'
        'log.retention.ms = 60000\n'
        '"log.index.interval.bytes" = 512\n'
    )
    config = BrokerConfig.load(path)
    assert config["broker.id"] == 3
    assert config["port"] == 0
    assert config["log.dir"] == "/tmp/pymq-data"
    assert config["log.segment.bytes"] == 8192
    assert config["num.partitions"] == BROKER_CONFIGS["num.partitions"].default
    defaults = config.log_defaults
    assert (defaults.segment_bytes, defaults.max_message_bytes, defaults.retention_ms) == (8192, 4096, 60_000)
    assert defaults.index_interval_bytes == 512


def test_broker_config_overrides_win_over_the_file_and_are_parsed(tmp_path):
    """A [log] table flattens too, and CLI-style string overrides replace file values, parsed alike."""
    path = tmp_path / "broker.toml"
    path.write_text("port = 9000\n[log]\nsegment.bytes = 16777216\n")
    config = BrokerConfig.load(path, overrides={"port": "9100", "event.loop": "asyncio"})
    assert config["port"] == 9100
    assert config["event.loop"] == "asyncio"
    assert config["log.segment.bytes"] == 16 << 20


def test_broker_config_load_without_a_file_uses_defaults():
    """No file and no overrides gives every default."""
    config = BrokerConfig.load()
    assert config["port"] == 9092
    assert config.log_defaults == LogConfig()


def test_broker_limits_that_overflow_positions_are_rejected_at_load(tmp_path):
    """log.segment.bytes + message.max.bytes past 2^31-1 fails at start-up, not at the first append."""
    path = tmp_path / "broker.toml"
    path.write_text("[log]\nsegment.bytes = 2147483000\n")
    with pytest.raises(InvalidConfigError, match="32-bit positions"):
        BrokerConfig.load(path)


def test_socket_request_max_must_exceed_message_max():
    """A request frame must hold a full batch plus framing: message.max.bytes + 1 KiB <= socket.request.max.bytes."""
    with pytest.raises(InvalidConfigError, match="socket.request.max.bytes"):
        BrokerConfig.from_mapping({"socket.request.max.bytes": 8 << 20})
    BrokerConfig.from_mapping({"socket.request.max.bytes": (8 << 20) + 1024})


@pytest.mark.parametrize(
    "values, match",
    [({"no.such.key": 1}, "no.such.key"), ({"port": 70000}, "port"), ({"event.loop": "trio"}, "event.loop"),
     ({"segment.bytes": 8192}, "segment.bytes")],
    ids=["unknown_key", "port_out_of_range", "bad_choice", "topic_key_at_broker_level"],
)
def test_bad_broker_configs_are_rejected(values, match):
    """Unknown broker keys and out-of-range values raise INVALID_CONFIG naming the key."""
    with pytest.raises(InvalidConfigError, match=match):
        BrokerConfig.from_mapping(values)


# -- topic names ----------------------------------------------------------------------------------

VALID_NAMES = [("a", "single_char"), ("a.b_c-1", "all_legal_punctuation"), ("x" * TOPIC_NAME_MAX, "249_chars"),
               ("...", "three_dots"), ("__consumer_offsets", "internal_topic")]
INVALID_NAMES = [("", "empty"), (".", "dot"), ("..", "dot_dot"), ("a/b", "slash"), ("a b", "space"),
                 ("x" * (TOPIC_NAME_MAX + 1), "250_chars"), ("caf\u00e9", "non_ascii"), ("a\n", "newline"),
                 (None, "none"), (42, "int"), (b"abc", "bytes")]


@pytest.mark.parametrize("name", [n for n, _ in VALID_NAMES], ids=[i for _, i in VALID_NAMES])
def test_valid_topic_names_are_accepted(name):
    """Names of 1..249 characters from [a-zA-Z0-9._-], other than '.' and '..', are returned unchanged."""
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", [n for n, _ in INVALID_NAMES], ids=[i for _, i in INVALID_NAMES])
def test_invalid_topic_names_raise_invalid_topic(name):
    """Empty, '.', '..', too long, illegal characters and non-strings raise INVALID_TOPIC_EXCEPTION."""
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


# -- producer timestamp bounds (KIP-937) -----------------------------------------------------------


def test_timestamp_bounds_have_kafkas_names_and_defaults():
    """message.timestamp.before/after.max.ms default to no limit into the past and one hour into
    the future, under Kafka's broker keys, and reach LogConfig under their python names."""
    assert TOPIC_CONFIGS["message.timestamp.before.max.ms"][1] == "log.message.timestamp.before.max.ms"
    assert TOPIC_CONFIGS["message.timestamp.after.max.ms"][1] == "log.message.timestamp.after.max.ms"
    defaults = BrokerConfig.from_mapping({}).log_defaults
    assert (defaults.message_timestamp_before_max_ms, defaults.message_timestamp_after_max_ms) == (2**63 - 1, 3_600_000)
    broker = BrokerConfig.from_mapping({"log.message.timestamp.after.max.ms": "60000"}).log_defaults
    topic = LogConfig.from_dotted({"message.timestamp.before.max.ms": "86400000"}, broker)
    assert (topic.message_timestamp_before_max_ms, topic.message_timestamp_after_max_ms) == (86_400_000, 60_000)
    assert topic.to_dotted()["message.timestamp.before.max.ms"] == 86_400_000


@pytest.mark.parametrize("key", ["message.timestamp.before.max.ms", "message.timestamp.after.max.ms"])
def test_timestamp_bounds_refuse_negative_values(key):
    """A negative bound is INVALID_CONFIG naming the key (0 is allowed: the broker's clock exactly)."""
    assert parse_topic_configs({key: "0"}) == {key: 0}
    with pytest.raises(InvalidConfigError, match=key):
        parse_topic_configs({key: "-1"})


def test_shipped_broker_toml_sets_the_timestamp_bounds_to_their_defaults():
    """conf/broker.toml documents both keys with the defaults."""
    config = BrokerConfig.load(Path(__file__).resolve().parents[2] / "conf" / "broker.toml")
    assert config.values["log.message.timestamp.before.max.ms"] == 2**63 - 1
    assert config.values["log.message.timestamp.after.max.ms"] == 3_600_000


# -- compaction (the log cleaner) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected, compact, delete",
    [("delete", "delete", False, True), ("compact", "compact", True, False),
     ("compact,delete", "compact,delete", True, True), ("delete,compact", "compact,delete", True, True),
     (" delete , compact ", "compact,delete", True, True), ("compact,compact", "compact", True, False)],
    ids=["delete", "compact", "both", "both_reversed", "both_spaced", "repeated"],
)
def test_cleanup_policy_is_normalised_and_says_what_applies(raw, expected, compact, delete):
    """cleanup.policy takes Kafka's list in any order and stores one spelling; `compact` turns the
    log cleaner on, `delete` retention by time and size."""
    config = LogConfig.from_dotted({"cleanup.policy": raw})
    assert (config.cleanup_policy, config.compact, config.delete) == (expected, compact, delete)
    assert parse_topic_configs({"cleanup.policy": raw}) == {"cleanup.policy": expected}


def test_compaction_configs_have_kafkas_names_and_defaults():
    """The topic configs of compaction sit under Kafka's log.cleaner.* broker keys with Kafka's defaults."""
    expected = {
        "delete.retention.ms": ("log.cleaner.delete.retention.ms", 86_400_000),
        "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio", 0.5),
        "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms", 0),
        "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms", INT64_MAX),
        "cleanup.policy": ("log.cleanup.policy", "delete"),
    }
    assert {name: (TOPIC_CONFIGS[name][1], TOPIC_CONFIGS[name][0].default) for name in expected} == expected
    broker = BrokerConfig.from_mapping({"log.cleaner.min.cleanable.ratio": "0.1", "log.cleanup.policy": "compact"})
    topic = LogConfig.from_dotted({"delete.retention.ms": "1000"}, broker.log_defaults)
    assert (topic.min_cleanable_dirty_ratio, topic.cleanup_policy, topic.delete_retention_ms) == (0.1, "compact", 1000)
    assert topic.to_dotted()["min.cleanable.dirty.ratio"] == 0.1


def test_min_compaction_lag_must_not_exceed_max():
    """min.compaction.lag.ms > max.compaction.lag.ms is INVALID_CONFIG naming both (Kafka's check)."""
    with pytest.raises(InvalidConfigError, match="min.compaction.lag.ms.*max.compaction.lag.ms"):
        LogConfig.from_dotted({"min.compaction.lag.ms": 2000, "max.compaction.lag.ms": 1000})
    assert LogConfig.from_dotted({"min.compaction.lag.ms": 1000, "max.compaction.lag.ms": 1000}).max_compaction_lag_ms == 1000


def test_log_cleaner_broker_configs_have_kafkas_defaults():
    """log.cleaner.enable, dedupe buffer, backoff and I/O buffer default as in Kafka."""
    config = BrokerConfig.from_mapping({})
    assert config["log.cleaner.enable"] is True
    assert config["log.cleaner.dedupe.buffer.size"] == 128 << 20
    assert config["log.cleaner.backoff.ms"] == 15_000
    assert config["log.cleaner.io.buffer.size"] == 512 << 10
    assert BrokerConfig.from_mapping({"log.cleaner.enable": "false"})["log.cleaner.enable"] is False
    with pytest.raises(InvalidConfigError, match="log.cleaner.dedupe.buffer.size"):
        BrokerConfig.from_mapping({"log.cleaner.dedupe.buffer.size": 1024})


# -- the group coordinator's configs -----------------------------------------------------------------


def test_group_coordinator_configs_have_kafkas_defaults():
    """offsets.* and group.* broker configs default as in Kafka."""
    config = BrokerConfig.from_mapping({})
    assert {key: config[key] for key in (
        "offsets.topic.num.partitions", "offsets.topic.segment.bytes", "offsets.retention.minutes",
        "offsets.retention.check.interval.ms", "offset.metadata.max.bytes", "group.min.session.timeout.ms",
        "group.max.session.timeout.ms", "group.initial.rebalance.delay.ms", "group.max.size")} == {
        "offsets.topic.num.partitions": 50, "offsets.topic.segment.bytes": 100 << 20,
        "offsets.retention.minutes": 10_080, "offsets.retention.check.interval.ms": 600_000,
        "offset.metadata.max.bytes": 4096, "group.min.session.timeout.ms": 6000,
        "group.max.session.timeout.ms": 1_800_000, "group.initial.rebalance.delay.ms": 3000,
        "group.max.size": INT32_MAX}


@pytest.mark.parametrize(
    "values, match",
    [({"offsets.topic.num.partitions": 0}, "offsets.topic.num.partitions"),
     ({"offsets.topic.num.partitions": 1001}, "offsets.topic.num.partitions"),
     ({"offsets.topic.segment.bytes": 4095}, "offsets.topic.segment.bytes"),
     ({"offsets.retention.minutes": 0}, "offsets.retention.minutes"),
     ({"offsets.retention.check.interval.ms": 0}, "offsets.retention.check.interval.ms"),
     ({"offset.metadata.max.bytes": (1 << 20) + 1}, "offset.metadata.max.bytes"),
     ({"group.min.session.timeout.ms": 0}, "group.min.session.timeout.ms"),
     ({"group.initial.rebalance.delay.ms": -1}, "group.initial.rebalance.delay.ms"),
     ({"group.max.size": 0}, "group.max.size")],
    ids=["no_offsets_partitions", "too_many_offsets_partitions", "offsets_segment_too_small",
         "zero_offsets_retention", "zero_check_interval", "metadata_over_1mib", "zero_min_session",
         "negative_rebalance_delay", "zero_group_size"],
)
def test_group_coordinator_configs_are_bounded(values, match):
    """Each group coordinator limit outside its bounds is INVALID_CONFIG naming the key."""
    with pytest.raises(InvalidConfigError, match=match):
        BrokerConfig.from_mapping(values)


def test_group_session_timeout_bounds_must_be_ordered():
    """group.min.session.timeout.ms above group.max.session.timeout.ms fails at start-up naming both."""
    with pytest.raises(InvalidConfigError, match="group.min.session.timeout.ms.*group.max.session.timeout.ms"):
        BrokerConfig.from_mapping({"group.min.session.timeout.ms": 10_000, "group.max.session.timeout.ms": 9_999})
    config = BrokerConfig.from_mapping({"group.min.session.timeout.ms": 10_000, "group.max.session.timeout.ms": 10_000})
    assert config["group.max.session.timeout.ms"] == 10_000


def test_shipped_broker_toml_sets_cleaner_and_group_keys_to_their_defaults():
    """conf/broker.toml documents the log cleaner's and the group coordinator's keys with their defaults."""
    config = BrokerConfig.load(Path(__file__).resolve().parents[2] / "conf" / "broker.toml")
    keys = [key for key in config.values if key.startswith(("log.cleaner.", "offsets.", "offset.", "group."))]
    assert len(keys) == 17
    assert {key: config.values[key] for key in keys} == {key: BROKER_CONFIGS[key].default for key in keys}


# --- tiered storage ---------------------------------------------------------------------------


def test_tiering_topic_configs_default_to_kafkas():
    """remote.storage.enable is off; local.retention.* are -2, which means the whole log's retention."""
    config = LogConfig(retention_ms=1000, retention_bytes=5000)
    assert (config.remote_storage_enable, config.local_retention_ms, config.local_retention_bytes) == (False, -2, -2)
    assert (config.effective_local_retention_ms, config.effective_local_retention_bytes) == (1000, 5000)
    assert TOPIC_CONFIGS["local.retention.ms"][1] == "log.local.retention.ms"


def test_tiering_topic_configs_parse_and_override():
    """A topic enables tiering and keeps less locally than in the whole log."""
    config = LogConfig.from_dotted({"remote.storage.enable": "true", "local.retention.ms": "60000",
                                    "local.retention.bytes": 4096, "retention.bytes": 8192})
    assert config.remote_storage_enable
    assert (config.effective_local_retention_ms, config.effective_local_retention_bytes) == (60000, 4096)


@pytest.mark.parametrize("values", [
    {"local.retention.ms": 2000, "retention.ms": 1000},
    {"local.retention.bytes": -1, "retention.bytes": 1000},
    {"local.retention.bytes": -3},
], ids=["local-ms-above-whole", "local-bytes-unbounded-whole-bounded", "below-minus-two"])
def test_local_retention_cannot_exceed_the_whole_logs(values):
    """Kafka's rule: the local log is part of the whole log, so it is never kept longer."""
    with pytest.raises(InvalidConfigError):
        LogConfig.from_dotted(values)


def test_remote_storage_broker_configs():
    """The remote store defaults to a folder of the log dir; the S3 keys become fsspec options."""
    config = BrokerConfig.from_mapping({"log.dir": "/srv/pymq"})
    assert config.remote_storage_url == "file:///srv/pymq/remote"
    assert config.remote_storage_options == {}
    assert not config["remote.log.storage.system.enable"]
    assert config["remote.log.manager.task.interval.ms"] == 30_000
    assert config["remote.log.manager.thread.pool.size"] == 2
    s3 = BrokerConfig.from_mapping({"remote.storage.url": "s3://bucket/pymq", "remote.storage.s3.endpoint.url": "http://x:9000",
                                    "remote.storage.s3.access.key": "k", "remote.storage.s3.secret.key": "s",
                                    "remote.storage.s3.region": "eu-west-1"})
    assert s3.remote_storage_url == "s3://bucket/pymq"
    assert s3.remote_storage_options == {"endpoint_url": "http://x:9000", "key": "k", "secret": "s", "region": "eu-west-1",
                                         "connect_timeout_s": 10.0, "read_timeout_s": 30.0, "max_attempts": 3}
    hurried = BrokerConfig.from_mapping({"remote.storage.url": "s3://bucket/pymq", "remote.storage.s3.read.timeout.ms": 2500,
                                         "remote.storage.s3.connect.timeout.ms": 500, "remote.storage.s3.max.attempts": 1})
    assert hurried.remote_storage_options == {"connect_timeout_s": 0.5, "read_timeout_s": 2.5, "max_attempts": 1}
    # Other stores take no S3 settings (they would reach their fsspec filesystem as unknown arguments).
    assert BrokerConfig.from_mapping({"remote.storage.url": "memory://x", "remote.storage.s3.region": "r"}).remote_storage_options == {}
