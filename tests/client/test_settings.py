"""Client settings as Kafka users paste them: the reference page is the code's (generated, compared
here), Kafka's names and values are accepted where pymq has the setting, and the ones it has not
are refused with what pymq does instead, or as not yet supported."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from client import Admin, Consumer, Producer
from client.config import client_settings
from client.consumer import AsyncConsumer
from client.producer import AsyncProducer
from client.settings import render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "client-settings.md"


def test_the_settings_page_is_generated_from_the_code():
    """docs/client-settings.md is what `python -m client.settings` prints now: a setting
    added, removed or given another default without regenerating it fails here."""
    assert PAGE.read_text() == render(), "regenerate: python -m client.settings > docs/client-settings.md"


@pytest.mark.parametrize("settings, message", [
    ({"key.serializer": "org.apache.kafka.common.serialization.StringSerializer"}, "pymq sends bytes: encode keys"),
    ({"value_deserializer": "x"}, "pymq returns bytes: decode record.value"),
    ({"partitioner.class": "x"}, "key.partitioner config"),
    ({"security.protocol": "SSL"}, "plaintext TCP today"),
])
def test_kafka_settings_without_a_pymq_counterpart_say_why(settings, message):
    with pytest.raises(ValueError, match=message):
        client_settings(AsyncProducer.__init__, "127.0.0.1:9", settings, {})


def test_kafka_settings_of_exactly_once_are_pymq_settings():
    """isolation.level, enable.idempotence, transactional.id: Kafka's names map to the keywords;
    a value pymq does not know is refused by the client that takes it."""
    _, kwargs = client_settings(AsyncConsumer.__init__, {"bootstrap.servers": "h:1", "isolation.level": "read_committed",
                                                         "max.poll.records": 7, "client.id": "c"}, None, {})
    assert kwargs == {"isolation_level": "read_committed", "max_poll_records": 7, "client_id": "c"}
    _, kwargs = client_settings(AsyncProducer.__init__, "h:1", {"enable.idempotence": "false",
                                                                "transactional.id": "t-1"}, {})
    assert kwargs == {"enable_idempotence": "false", "transactional_id": "t-1"}
    with pytest.raises(ValueError, match="isolation_level must be 'read_uncommitted' or 'read_committed'"):
        AsyncConsumer("h:1", isolation_level="serializable")


def test_pasted_kafka_configs_work_against_a_broker(shared_broker, new_topic, caplog):
    """client.id, compression.type=gzip (zstd here, said in the log), auto.offset.reset=smallest,
    max.poll.records."""
    topic = new_topic(1)
    with Producer({"bootstrap.servers": shared_broker.bootstrap, "client.id": "orders-service",
                   "compression.type": "gzip", "linger.ms": 0}) as producer:
        producer.send_batch(topic, pa.table({"value": [b"x" * 100] * 20}))
        producer.flush()
    assert "compression 'gzip' is 'zstd' here" in caplog.text
    with Consumer({"bootstrap.servers": shared_broker.bootstrap, "auto.offset.reset": "smallest",
                   "max.poll.records": 3, "client.id": "reader"}) as consumer:
        consumer.assign([(topic, 0)])
        polls = []
        while sum(polls) < 20:
            polls.append(len(consumer.poll(2000)))
        assert max(polls) == 3
    with Admin({"bootstrap.servers": shared_broker.bootstrap, "client.id": "ops", "default.api.timeout.ms": 5000}) as admin:
        assert topic in admin.list_topics()
