"""TopicPartition: the (topic, partition) pair that keys nearly every per-partition map in pymq,
Kafka's `org.apache.kafka.common.TopicPartition`. The one definition every layer imports.

A plain tuple on purpose: it hashes and compares at C speed (the broker looks partitions up per
request), crosses msgpack and pickle (Spark tasks) as it is, and unpacks as `topic, partition`.
"""

TopicPartition = tuple[str, int]
