"""The lightweight pymq client: Producer, Consumer and Admin, each with an asyncio core."""
from broker.client.admin import (
    EARLIEST,
    LATEST,
    Admin,
    AdminError,
    AsyncAdmin,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetAndMetadata,
    PartitionLag,
    TopicDescription,
)
from broker.client.consumer import AsyncConsumer, Consumer
from broker.client.decoder import RECORD_SCHEMA, ConsumerRecord
from broker.client.consumer_coordinator import GroupMetadata
from broker.client.producer import AsyncProducer, Producer
from broker.client.producer_batch import RecordFuture, RecordMetadata

__all__ = [
    "Admin", "AdminError", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Consumer", "ConsumerRecord",
    "EARLIEST", "GroupDescription", "GroupListing", "GroupMetadata", "LATEST", "MemberDescription",
    "OffsetAndMetadata", "PartitionLag", "Producer", "RECORD_SCHEMA", "RecordFuture", "RecordMetadata",
    "TopicDescription",
]
