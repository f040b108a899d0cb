"""Topic limits on a real broker: every topic name that can be created can be deleted and created
again (the longest, 249 characters, with multi-digit partition numbers); max.partitions bounds the
partitions one broker hosts."""
from __future__ import annotations

import pytest

from client import Admin, Consumer, Producer
from common.errors import PolicyViolationError
from segment_format.layout import TOPIC_NAME_MAX

LONGEST = "L" * (TOPIC_NAME_MAX - 2) + "-x"  # a dash inside, as a partition directory's name has


@pytest.mark.slow
def test_the_longest_topic_name_is_deleted_whole_and_can_be_created_again(broker):
    """Before the fix the rename to `<name>-<p>.<uuid>-delete` exceeded the file-name limit: the
    topic left the metadata, its directories stayed and the name could not be created again."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(LONGEST, 12)
        with Producer(broker.bootstrap, acks=1) as producer:
            for p in (0, 11):
                producer.send(LONGEST, b"old", partition=p).result(30)
        admin.delete_topics([LONGEST])
        assert not [p.name for p in broker.log_dir.iterdir() if p.name.startswith("LLLL")]
        admin.create_topic(LONGEST, 12)
        assert admin.list_offsets({(LONGEST, 11): -1})[(LONGEST, 11)][0] == 0
    consumer = Consumer(broker.bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(LONGEST, 11)])
        assert consumer.poll_arrow(timeout_ms=500).num_rows == 0  # nothing of the old topic came back
    finally:
        consumer.close()


@pytest.mark.slow
def test_max_partitions_refuses_creations_and_growth_beyond_it_with_policy_violation(broker_factory):
    """max.partitions=50 on one broker: topics and added partitions up to 50 are created; one
    partition more, validate-only or not, is POLICY_VIOLATION and creates nothing; the internal
    __consumer_offsets (50 partitions of its own) is exempt, so groups still commit offsets."""
    broker = broker_factory(**{"max.partitions": 50}).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("thirty", 30)
        for refused in (lambda: admin.create_topic("too-many", 21),
                        lambda: admin.create_topic("too-many", 21, validate_only=True),
                        lambda: admin.create_partitions("thirty", 51),
                        lambda: admin.create_partitions("thirty", 51, validate_only=True)):
            with pytest.raises(PolicyViolationError, match="would put 51 partition replicas on broker 0 .*"
                                                           "max.partitions is 50"):
                refused()
        assert "too-many" not in admin.list_topics()
        admin.create_topic("twenty", 20)  # exactly at the limit
        with pytest.raises(PolicyViolationError):
            admin.create_topic("one-more", 1)
        assert sorted(t for t in admin.list_topics() if not t.startswith("__")) == ["thirty", "twenty"]
        assert {p.partition for p in admin.describe_topics(["thirty"])[0].partitions} == set(range(30))
    consumer = Consumer(broker.bootstrap, group_id="at-the-limit", auto_offset_reset="earliest")
    try:
        consumer.assign([("thirty", 0)])
        consumer.commit({("thirty", 0): 0})
        assert consumer.committed([("thirty", 0)]) == {("thirty", 0): 0}
    finally:
        consumer.close()
