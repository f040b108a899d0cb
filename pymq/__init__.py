"""pymq: `from pymq import Producer, Consumer, Admin`.

The client lives in the `client` package, a layer below the broker and the Spark source; this
package is the name applications import, as they import `kafka` or `confluent_kafka`, and sits
above the Spark source because `history()` reads through it. `history(spark, ...)`
(pymq/topic_history.py) is loaded on first use: importing pymq does not start importing Spark.
"""
from typing import Any

from client import (
    EARLIEST,
    LATEST,
    RECORD_SCHEMA,
    Admin,
    AdminError,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    GroupMetadata,
    MemberDescription,
    OffsetAndMetadata,
    PartitionLag,
    PreparedTransaction,
    PreviousTransaction,
    Producer,
    RecordFuture,
    RecordMetadata,
    TopicDescription,
)
from common.errors import PymqError

__all__ = [
    "Admin", "AdminError", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Consumer", "ConsumerRecord",
    "EARLIEST", "GroupDescription", "GroupListing", "GroupMetadata", "LATEST", "MemberDescription",
    "OffsetAndMetadata", "PartitionLag", "PreparedTransaction", "PreviousTransaction", "Producer", "PymqError", "RECORD_SCHEMA", "RecordFuture", "RecordMetadata",
    "TopicDescription", "history",
]


def __getattr__(name: str) -> Any:
    if name == "history":
        from pymq.topic_history import history

        return history
    raise AttributeError(f"module 'pymq' has no attribute {name!r}")
