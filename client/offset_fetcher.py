"""ListOffsets for many partitions, one request per leader (Kafka's OffsetFetcher).

Used by the consumer (resets, seek_to_*, offsets_for_times), the admin client and the range
reader. Loop-local: call it on the loop that owns the `Cluster`.
"""
from __future__ import annotations

from client.cluster import Cluster
from common.topic_partition import TopicPartition
from protocol import ListOffsetsPartition, ListOffsetsRequest, TopicRequest


async def list_offsets(cluster: Cluster, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets for many partitions, one request per leader; raises the first partition error."""
    by_node: dict[int, dict[str, list[ListOffsetsPartition]]] = {}
    for (topic, partition), ts in timestamps.items():
        node = await cluster.leader(topic, partition)
        by_node.setdefault(node, {}).setdefault(topic, []).append(ListOffsetsPartition(partition, ts))
    out: dict[TopicPartition, tuple[int, int]] = {}
    for node, topics in by_node.items():
        reply = await cluster.send(node, ListOffsetsRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items())))
        for t in reply.topics:
            for p in t.partitions:
                err = p.error()
                if err is not None:
                    raise err
                out[(t.name, p.partition)] = (p.offset, p.timestamp)
    return out
