"""Review fixes for the pymq Spark source: each test failed before its fix."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from client import Admin, Producer
from broker.process import BrokerProcess
from spark_datasource.batch_reader import PymqBatchReader
from spark_datasource.options import InvalidOptionError, SourceOptions
from spark_datasource.ranges import OffsetRange
from spark_datasource.schema import spark_schema
from spark_datasource.source import PymqDataSource

TOPIC = "review"
PARTITIONS = 2
PER_PARTITION = 20


@pytest.fixture(scope="module")
def review(source_broker: BrokerProcess) -> Iterator[str]:
    """`review`: 2 partitions of 20 records each; its bootstrap address."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, configs={"retention.ms": -1})
    with Producer(bootstrap) as producer:
        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                producer.send(TOPIC, f"v{i}".encode(), partition=p)
        producer.flush()
    yield bootstrap


def batch_reader(bootstrap: str, **options: str) -> PymqBatchReader:
    return PymqBatchReader(SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC, **options},
                                               streaming=False))


def test_json_offsets_naming_every_partition_plan_exactly_their_ranges(review):
    """startingOffsets/endingOffsets JSON naming every partition (-1 latest) plan those ranges."""
    reader = batch_reader(review, startingOffsets=json.dumps({TOPIC: {"0": 3, "1": 5}}),
                          endingOffsets=json.dumps({TOPIC: {"0": 10, "1": -1}}))
    assert reader.plan() == [OffsetRange(TOPIC, 0, 3, 10), OffsetRange(TOPIC, 1, 5, PER_PARTITION)]


def test_a_user_specified_schema_other_than_the_sources_is_refused_when_the_query_is_planned():
    """The schema is fixed (Kafka's source refuses a custom one): a different one used to fail
    each task with Spark's "Return schema mismatch", after the data was fetched."""
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": TOPIC}
    custom = StructType([StructField("value", BinaryType())])
    for make in (lambda s: PymqDataSource(options).reader(s), lambda s: PymqDataSource(options).streamReader(s)):
        with pytest.raises(InvalidOptionError, match="fixed schema"):
            make(custom)
        make(spark_schema(False))  # the source's own schema (what Spark passes without .schema())
    with pytest.raises(InvalidOptionError, match="includeHeaders"):
        PymqDataSource({**options, "includeHeaders": "true"}).reader(spark_schema(False))
