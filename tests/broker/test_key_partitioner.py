"""The `key.partitioner` topic config against real broker processes: new topics get Kafka's
murmur2 placement (or the broker's `key.partitioner`), stored with the topic; a topic stored
before the config existed keeps murmur3; producers learn the topic's choice from Metadata and
place keyed records (one at a time and whole Arrow columns) by it."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from client import Admin, Consumer, Producer
from client.partitioner import partition_for_key
from broker.server import METADATA_FILE

KEYS = [b"customer-%d" % i for i in range(40)]


def placed(bootstrap: str, topic: str) -> dict[bytes, int]:
    """Each key's partition, as consumed."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in range(5)])
        return {r.key: r.partition for r in consumer.records(idle_timeout_ms=1000)}


def produce_keys(bootstrap: str, topic: str) -> None:
    with Producer(bootstrap) as producer:
        for key in KEYS[:20]:
            producer.send(topic, b"v", key=key)
        producer.send_batch(topic, pa.table({"key": KEYS[20:], "value": [b"v"] * 20}))
        producer.flush()


@pytest.mark.slow
def test_new_topics_place_keys_as_kafka_does_and_say_so(broker_factory):
    broker = broker_factory().start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("kafka-placed", partitions=5)
        assert admin.describe_configs(["kafka-placed"])["kafka-placed"]["key.partitioner"] == {
            "value": "murmur2", "source": "topic"}  # stored with the topic
    produce_keys(broker.bootstrap, "kafka-placed")
    assert placed(broker.bootstrap, "kafka-placed") == {k: partition_for_key(k, 5, "murmur2") for k in KEYS}


@pytest.mark.slow
def test_a_topic_stored_before_the_config_keeps_murmur3_and_a_broker_may_default_to_it(broker_factory):
    broker = broker_factory(**{"key.partitioner": "murmur3"}).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("legacy", partitions=5)
        admin.create_topic("chosen", partitions=5, configs={"key.partitioner": "murmur2"})
        assert admin.describe_configs(["legacy"])["legacy"]["key.partitioner"]["value"] == "murmur3"
    broker.stop()
    store = broker.log_dir / METADATA_FILE  # as an older pymq stored it: no key.partitioner
    state = json.loads(store.read_text())
    del state["keys"]["topics/legacy"]["value"]["configs"]["key.partitioner"]
    store.write_text(json.dumps(state))
    broker.overrides.pop("key.partitioner")  # restarted with the default: murmur2 for new topics
    broker.start()
    produce_keys(broker.bootstrap, "legacy")
    produce_keys(broker.bootstrap, "chosen")
    assert placed(broker.bootstrap, "legacy") == {k: partition_for_key(k, 5, "murmur3") for k in KEYS}
    assert placed(broker.bootstrap, "chosen") == {k: partition_for_key(k, 5, "murmur2") for k in KEYS}
    with Admin(broker.bootstrap) as admin:
        admin.alter_configs("legacy", delete=["key.partitioner"])  # reset: the broker's default, stored
        assert admin.describe_configs(["legacy"])["legacy"]["key.partitioner"]["value"] == "murmur2"
