"""Topic limits on a real broker: every topic name that can be created can be deleted and created
again (the longest, 249 characters, with multi-digit partition numbers)."""
from __future__ import annotations

from broker.client import Admin, Consumer, Producer
from segment_format.layout import TOPIC_NAME_MAX

LONGEST = "L" * (TOPIC_NAME_MAX - 2) + "-x"  # a dash inside, as a partition directory's name has


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
