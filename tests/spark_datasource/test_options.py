"""Options of the `pymq` source: `SourceOptions.parse` (no Spark) accepts the Kafka source's
forms and refuses every bad one with an error naming the option; through Spark, bad options and
unknown topics fail the query before any row is read, with the option or topic in the message."""
from __future__ import annotations

import json
import re

import pytest

from protocol import READ_COMMITTED, READ_UNCOMMITTED

from client import Admin
from broker.process import BrokerProcess
from spark_datasource.options import InvalidOptionError, OffsetSpec, SourceOptions

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}
SUB = {**BOOT, "subscribe": "t"}

# (id, options, streaming, the option the message must name)
INVALID = [
    ("unknown-option", {**SUB, "startingOffset": "earliest"}, False, "startingoffset"),
    ("unknown-kafka-setting", {**SUB, "kafka.group.id": "g"}, False, "kafka.group.id"),
    ("no-subscription", BOOT, False, "subscribe"),
    ("subscribe-and-assign", {**SUB, "assign": '{"t":[0]}'}, False, "assign"),
    ("subscribe-and-pattern", {**SUB, "subscribePattern": "t.*"}, True, "subscribePattern"),
    ("subscribe-empty", {**BOOT, "subscribe": " , "}, False, "subscribe"),
    ("pattern-bad-regex", {**BOOT, "subscribePattern": "t(["}, False, "subscribePattern"),
    ("pattern-empty", {**BOOT, "subscribePattern": " "}, False, "subscribePattern"),
    ("assign-malformed-json", {**BOOT, "assign": '{"t":[0'}, False, "assign"),
    ("assign-not-object", {**BOOT, "assign": "[0, 1]"}, False, "assign"),
    ("assign-empty-object", {**BOOT, "assign": "{}"}, False, "assign"),
    ("assign-negative-partition", {**BOOT, "assign": '{"t":[-1]}'}, False, "assign"),
    ("assign-partition-not-int", {**BOOT, "assign": '{"t":["0"]}'}, False, "assign"),
    ("assign-not-list", {**BOOT, "assign": '{"t":0}'}, False, "assign"),
    ("starting-malformed-json", {**SUB, "startingOffsets": '{"t":{"0":1}'}, False, "startingOffsets"),
    ("starting-unknown-word", {**SUB, "startingOffsets": "beginning"}, False, "startingOffsets"),
    ("starting-not-object", {**SUB, "startingOffsets": "[1]"}, False, "startingOffsets"),
    ("starting-topic-not-object", {**SUB, "startingOffsets": '{"t":5}'}, False, "startingOffsets"),
    ("starting-partition-not-number", {**SUB, "startingOffsets": '{"t":{"x":5}}'}, False, "startingOffsets"),
    ("starting-negative-partition", {**SUB, "startingOffsets": '{"t":{"-1":5}}'}, False, "startingOffsets"),
    ("starting-offset-string", {**SUB, "startingOffsets": '{"t":{"0":"5"}}'}, False, "startingOffsets"),
    ("starting-offset-float", {**SUB, "startingOffsets": '{"t":{"0":5.5}}'}, False, "startingOffsets"),
    ("starting-offset-bool", {**SUB, "startingOffsets": '{"t":{"0":true}}'}, False, "startingOffsets"),
    ("starting-offset-below-minus-2", {**SUB, "startingOffsets": '{"t":{"0":-3}}'}, True, "startingOffsets"),
    ("starting-latest-in-batch", {**SUB, "startingOffsets": "latest"}, False, "startingOffsets"),
    ("starting-minus-1-in-batch", {**SUB, "startingOffsets": '{"t":{"0":-1}}'}, False, "startingOffsets"),
    ("ending-earliest", {**SUB, "endingOffsets": "earliest"}, False, "endingOffsets"),
    ("ending-minus-2", {**SUB, "endingOffsets": '{"t":{"0":-2}}'}, False, "endingOffsets"),
    ("ending-malformed-json", {**SUB, "endingOffsets": "{"}, False, "endingOffsets"),
    ("ending-offsets-in-streaming", {**SUB, "endingOffsets": "latest"}, True, "endingOffsets"),
    ("ending-timestamp-in-streaming", {**SUB, "endingTimestamp": "1700000000000"}, True, "endingTimestamp"),
    ("ending-by-timestamp-in-streaming", {**SUB, "endingOffsetsByTimestamp": '{"t":{"0":1}}'}, True,
     "endingOffsetsByTimestamp"),
    ("starting-timestamp-not-number", {**SUB, "startingTimestamp": "yesterday"}, False, "startingTimestamp"),
    ("starting-timestamp-negative", {**SUB, "startingTimestamp": "-5"}, False, "startingTimestamp"),
    ("ending-timestamp-float", {**SUB, "endingTimestamp": "1.5"}, False, "endingTimestamp"),
    ("by-timestamp-malformed", {**SUB, "startingOffsetsByTimestamp": "{'t': 1}"}, False, "startingOffsetsByTimestamp"),
    ("by-timestamp-negative", {**SUB, "startingOffsetsByTimestamp": '{"t":{"0":-2}}'}, False,
     "startingOffsetsByTimestamp"),
    ("ending-by-timestamp-string", {**SUB, "endingOffsetsByTimestamp": '{"t":{"0":"soon"}}'}, False,
     "endingOffsetsByTimestamp"),
    ("strategy-unknown", {**SUB, "startingOffsetsByTimestampStrategy": "earliest"}, False,
     "startingOffsetsByTimestampStrategy"),
    ("max-offsets-zero", {**SUB, "maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
    ("max-offsets-not-number", {**SUB, "maxOffsetsPerTrigger": "ten"}, True, "maxOffsetsPerTrigger"),
    ("max-offsets-float", {**SUB, "maxOffsetsPerTrigger": "1.5"}, True, "maxOffsetsPerTrigger"),
    ("min-offsets-negative", {**SUB, "minOffsetsPerTrigger": "-1"}, True, "minOffsetsPerTrigger"),
    ("min-above-max-offsets", {**SUB, "minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "10"}, True,
     "minOffsetsPerTrigger"),
    ("trigger-delay-word", {**SUB, "maxTriggerDelay": "soon"}, True, "maxTriggerDelay"),
    ("trigger-delay-unknown-unit", {**SUB, "maxTriggerDelay": "5 weeks"}, True, "maxTriggerDelay"),
    ("trigger-delay-negative", {**SUB, "maxTriggerDelay": "-1s"}, True, "maxTriggerDelay"),
    ("trigger-delay-fraction", {**SUB, "maxTriggerDelay": "1.5s"}, True, "maxTriggerDelay"),
    ("trigger-delay-empty", {**SUB, "maxTriggerDelay": ""}, True, "maxTriggerDelay"),
    ("min-partitions-zero", {**SUB, "minPartitions": "0"}, False, "minPartitions"),
    ("min-partitions-word", {**SUB, "minPartitions": "many"}, False, "minPartitions"),
    ("max-records-negative", {**SUB, "maxRecordsPerPartition": "-3"}, False, "maxRecordsPerPartition"),
    ("fail-on-data-loss-yes", {**SUB, "failOnDataLoss": "yes"}, False, "failOnDataLoss"),
    ("fail-on-data-loss-empty", {**SUB, "failOnDataLoss": ""}, True, "failOnDataLoss"),
    ("include-headers-1", {**SUB, "includeHeaders": "1"}, False, "includeHeaders"),
    ("path-given", {**SUB, "path": "t"}, False, "path"),
    ("bootstrap-missing", {"subscribe": "t"}, False, "bootstrap.servers"),
    ("bootstrap-blank", {"bootstrap.servers": "  ", "subscribe": "t"}, False, "bootstrap.servers"),
    ("bootstrap-spellings-disagree", {**SUB, "bootstrap.servers": "127.0.0.1:9093"}, False, "bootstrap.servers"),
    ("kafka-timeout-not-number", {**SUB, "kafka.request.timeout.ms": "30s"}, False, "kafka.request.timeout.ms"),
    ("kafka-fetch-bytes-zero", {**SUB, "kafka.max.partition.fetch.bytes": "0"}, False,
     "kafka.max.partition.fetch.bytes"),
    ("kafka-check-crcs-word", {**SUB, "kafka.check.crcs": "maybe"}, False, "kafka.check.crcs"),
    ("assign-with-starting-other-partition", {**BOOT, "assign": '{"t":[0]}', "startingOffsets": '{"t":{"1":5}}'},
     False, "startingOffsets"),
    ("assign-with-ending-missing-partition", {**BOOT, "assign": '{"t":[0,1]}', "endingOffsets": '{"t":{"0":5}}'},
     False, "endingOffsets"),
]


@pytest.mark.parametrize("option, value, message", [
    ("kafka.group.id", "etl", "joins no consumer group; .* use groupIdForLag"),
    ("groupIdPrefix", "spark-kafka-source", "joins no consumer group"),
    ("kafka.isolation.level", "serializable", "'kafka.isolation.level' must be 'read_committed' or 'read_uncommitted'"),
    ("kafka.security.protocol", "SASL_SSL", "security.protocol='SASL_SSL' is not yet supported: .*plaintext"),
    ("kafka.sasl.mechanism", "PLAIN", "sasl.mechanism is not a pymq setting: .*plaintext"),
    ("kafka.ssl.truststore.location", "/x", "ssl.truststore.location is not a pymq setting"),
    ("kafka.key.deserializer", "x", "pymq returns bytes"),
])
def test_kafka_source_options_pymq_answers_differently_say_why(option, value, message):
    """Options pasted from a Spark Kafka source: refused with the reason (or as not yet supported)."""
    with pytest.raises(InvalidOptionError, match=message):
        SourceOptions.parse({**SUB, option: value}, streaming=True)


def test_kafka_source_options_meaning_what_pymq_does_are_accepted():
    parsed = SourceOptions.parse({**SUB, "kafka.isolation.level": "read_uncommitted",
                                  "kafka.security.protocol": "plaintext"}, streaming=True)
    assert parsed.client == {} and parsed.isolation_level == READ_UNCOMMITTED


def test_the_source_reads_read_committed_unless_told_otherwise():
    """Unlike Spark's Kafka source (read_uncommitted), a pymq read never sees an aborted
    transaction's records unless it asks for read_uncommitted."""
    assert SourceOptions.parse(SUB, streaming=True).isolation_level == READ_COMMITTED
    assert SourceOptions.parse({**SUB, "kafka.isolation.level": "READ_COMMITTED"}, streaming=False).isolation_level \
        == READ_COMMITTED


@pytest.mark.parametrize("options, streaming, named", [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_option_is_refused_naming_it(options, streaming, named):
    """SourceOptions.parse refuses the option with an InvalidOptionError whose message names it."""
    with pytest.raises(InvalidOptionError, match=re.compile(re.escape(named), re.IGNORECASE)):
        SourceOptions.parse(options, streaming=streaming)


def test_batch_defaults():
    """A batch read with only bootstrap and subscribe reads earliest to latest, fails on data loss, no headers."""
    parsed = SourceOptions.parse(SUB, streaming=False)
    assert (parsed.bootstrap_servers, parsed.subscribe) == ("127.0.0.1:9092", ("t",))
    assert (parsed.starting.kind, parsed.ending.kind) == ("earliest", "latest")
    assert (parsed.fail_on_data_loss, parsed.include_headers, parsed.by_timestamp_strategy) == (True, False, "error")
    assert (parsed.min_partitions, parsed.max_records_per_partition, parsed.client) == (None, None, {})


def test_streaming_defaults():
    """A streaming read starts at latest and waits at most 15 minutes for minOffsetsPerTrigger."""
    parsed = SourceOptions.parse({**BOOT, "subscribePattern": "t-.*"}, streaming=True)
    assert parsed.starting.kind == "latest" and parsed.ending.kind == "latest"
    assert parsed.max_trigger_delay_ms == 15 * 60_000
    assert parsed.topic_matches("t-1") and not parsed.topic_matches("xt-1") and not parsed.topic_matches("t")


def test_option_names_are_case_insensitive_and_values_are_trimmed():
    """Mixed-case names (as users write them) and lower-cased ones (as Spark passes them) mean the same."""
    given = {"Bootstrap.Servers": " h:1 ", "SUBSCRIBE": "a, b,,c,a", "startingoffsets": " Earliest ",
             "FailOnDataLoss": "FALSE", "includeheaders": "True", "MinPartitions": " 4 "}
    parsed = SourceOptions.parse(given, streaming=False)
    assert (parsed.bootstrap_servers, parsed.subscribe) == ("h:1", ("a", "b", "c"))
    assert (parsed.starting.kind, parsed.fail_on_data_loss, parsed.include_headers, parsed.min_partitions) == \
        ("earliest", False, True, 4)


def test_offset_and_timestamp_forms_and_precedence():
    """JSON offsets, timestamps and by-timestamp JSON parse to specs, by Kafka's precedence on each side."""
    spec = SourceOptions.parse({**SUB, "startingOffsets": '{"t":{"0":23,"1":-2}}',
                                "endingOffsets": '{"t":{"0":-1,"1":50}}'}, streaming=False)
    assert spec.starting == OffsetSpec("offsets", {"t": {0: 23, 1: -2}}, option="startingOffsets")
    assert spec.ending == OffsetSpec("offsets", {"t": {0: -1, 1: 50}}, option="endingOffsets")
    both = SourceOptions.parse({**SUB, "startingTimestamp": "1000", "startingOffsetsByTimestamp": '{"t":{"0":5}}',
                                "startingOffsets": "earliest", "endingOffsetsByTimestamp": '{"t":{"0":9}}',
                                "endingOffsets": "latest"}, streaming=False)
    assert both.starting == OffsetSpec("timestamp", timestamp=1000, option="startingTimestamp")
    assert both.ending == OffsetSpec("timestamps", {"t": {0: 9}}, option="endingOffsetsByTimestamp")
    streaming = SourceOptions.parse({**SUB, "startingOffsets": '{"t":{"0":-1}}'}, streaming=True)
    assert streaming.starting.offsets == {"t": {0: -1}}


@pytest.mark.parametrize("text, ms", [("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("2h", 7_200_000),
                                      ("1d", 86_400_000), ("250", 250), (" 3 MIN ", 180_000)])
def test_max_trigger_delay_durations(text, ms):
    """maxTriggerDelay takes Spark's duration forms (a bare number is milliseconds)."""
    assert SourceOptions.parse({**SUB, "maxTriggerDelay": text}, streaming=True).max_trigger_delay_ms == ms


def test_kafka_client_settings_and_assign():
    """kafka.* client settings reach the client by its keyword names; assign parses to sorted partitions."""
    parsed = SourceOptions.parse({**BOOT, "assign": '{"a":[2,0,2],"b":[1]}', "kafka.request.timeout.ms": "5000",
                                  "kafka.max.partition.fetch.bytes": "1048576", "kafka.check.crcs": "false",
                                  "kafka.retry.backoff.ms": "20", "kafka.fetch.max.bytes": "2097152"},
                                 streaming=False)
    assert parsed.assign == {"a": (0, 2), "b": (1,)}
    assert parsed.client == {"request_timeout_ms": 5000, "max_partition_fetch_bytes": 1 << 20, "check_crcs": False,
                             "retry_backoff_ms": 20, "fetch_max_bytes": 2 << 20}
    assert parsed.topic_matches("a") and not parsed.topic_matches("c")


# -- through Spark ---------------------------------------------------------------------------------


def spark_read(spark, bootstrap: str, path: str | None = None, **options: str):
    reader = spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).options(**options)
    return reader.load(path) if path is not None else reader.load()


SPARK_INVALID = [
    ("starting-latest", {"subscribe": "t", "startingOffsets": "latest"}, "startingOffsets"),
    ("ending-earliest", {"subscribe": "t", "endingOffsets": "earliest"}, "endingOffsets"),
    ("unknown-option", {"subscribe": "t", "failOnDataLos": "false"}, "failondatalos"),
    ("no-subscription", {}, "subscribe"),
    ("bad-boolean", {"subscribe": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ("bad-include-headers", {"subscribe": "t", "includeHeaders": "yes"}, "includeHeaders"),
    ("bad-number", {"subscribe": "t", "minPartitions": "-2"}, "minPartitions"),
]


@pytest.mark.parametrize("options, named", [c[1:] for c in SPARK_INVALID], ids=[c[0] for c in SPARK_INVALID])
def test_spark_query_with_a_bad_option_fails_naming_it(spark, options, named):
    """A bad option fails the query at load() or its first action, and Spark's error text names the option."""
    with pytest.raises(Exception, match=re.compile(re.escape(named), re.IGNORECASE)):
        spark_read(spark, "127.0.0.1:1", **options).collect()


def test_spark_load_with_a_path_fails_naming_path(spark):
    """load(path) is refused: topics are named by subscribe, subscribePattern or assign."""
    with pytest.raises(Exception, match="'path'"):
        spark_read(spark, "127.0.0.1:1", path="t", subscribe="t").collect()


def test_spark_query_on_an_unknown_topic_fails_naming_it(spark, source_broker: BrokerProcess, topic_name):
    """subscribe or assign naming a topic that does not exist fails with the topic's name."""
    with Admin(source_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    missing = f"{topic_name}-missing"
    with pytest.raises(Exception, match=re.escape(missing)) as raised:
        spark_read(spark, source_broker.bootstrap, subscribe=f"{topic_name},{missing}").collect()
    # One readable line, not a Python traceback inside Spark's exception (conf/spark-defaults.conf).
    assert "Traceback" not in str(raised.value)
    assert f"InvalidOptionError: unknown topic(s) {missing} in option subscribe" in str(raised.value)
    with pytest.raises(Exception, match=re.escape(missing)):
        spark_read(spark, source_broker.bootstrap, assign=json.dumps({missing: [0]})).collect()
    with pytest.raises(Exception, match="no partition 2"):
        spark_read(spark, source_broker.bootstrap, assign=json.dumps({topic_name: [0, 2]})).collect()
    assert spark_read(spark, source_broker.bootstrap, subscribe=topic_name).count() == 0


def test_spark_json_offsets_leaving_out_a_partition_fail_naming_it(spark, source_broker: BrokerProcess, topic_name):
    """startingOffsets JSON must give every partition of the subscription: the one left out is named."""
    with Admin(source_broker.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    with pytest.raises(Exception, match=re.escape(f"{topic_name}-1")) as raised:
        spark_read(spark, source_broker.bootstrap, subscribe=topic_name,
                   startingOffsets=json.dumps({topic_name: {"0": 0}})).collect()
    assert "startingOffsets" in str(raised.value)


SPARK_FORMS = {  # one set of offsets as Spark and its users write it
    "compact": '{"orders.v1":{"0":23,"1":-2,"2":-1},"t-b":{"0":9223372036854775807}}',
    "spaced": '{"orders.v1": {"0": 23, "1": -2, "2": -1}, "t-b": {"0": 9223372036854775807}}',
    "pretty": '{\n  "orders.v1" : {\n    "0" : 23,\n    "1" : -2,\n    "2" : -1\n  },\n  "t-b" : {\n    "0" : 9223372036854775807\n  }\n}',
}


@pytest.mark.parametrize("text", SPARK_FORMS.values(), ids=SPARK_FORMS.keys())
def test_offsets_json_in_sparks_exact_forms(text):
    """startingOffsets (streaming: -2 earliest, -1 latest per partition) and endingOffsets (batch:
    -1 latest) accept the JSON Spark's Kafka source writes and its progress reports, compact,
    spaced or pretty-printed, any topic name, any offset a long holds."""
    offsets = {"orders.v1": {0: 23, 1: -2, 2: -1}, "t-b": {0: 9223372036854775807}}
    options = {**BOOT, "subscribe": "orders.v1,t-b"}
    streaming = SourceOptions.parse({**options, "startingOffsets": text}, streaming=True)
    assert streaming.starting == OffsetSpec("offsets", offsets, option="startingOffsets")
    batch = SourceOptions.parse({**options, "endingOffsets": text.replace("-2", "5")}, streaming=False)
    assert batch.ending == OffsetSpec("offsets", {**offsets, "orders.v1": {0: 23, 1: 5, 2: -1}}, option="endingOffsets")
