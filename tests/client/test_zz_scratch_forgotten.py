"""Scratch: the coordinator forgets a live member's group (its __consumer_offsets partition lost)."""
import shutil
from broker.coordinator.group_records import partition_for
from client import Admin, Consumer
from tests.client.test_group_consumer import BROKER_OVERRIDES, FAST, Member, poll_until, produce, values_of


import pytest
@pytest.mark.parametrize("hb,ac", [(5000, 100), (200, 100), (5000, 5000), (1000, 50)])
def test_member_whose_coordinator_forgot_the_group_rejoins_and_consumes(broker_factory, hb, ac):
    broker = broker_factory(**BROKER_OVERRIDES).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("forgot", partitions=2)
    produce(broker.bootstrap, "forgot", 10)
    consumer = Consumer(broker.bootstrap, group_id="forgot", **{**FAST, "session_timeout_ms": 15_000,
                                                                 "request_timeout_ms": 5000, "heartbeat_interval_ms": hb, "auto_commit_interval_ms": ac})
    member = Member(consumer).subscribe(["forgot"])
    try:
        poll_until([member], lambda: len(member.records) == 10, what="10 records")
        consumer.commit()
        broker.kill()
        p = partition_for("forgot", BROKER_OVERRIDES["offsets.topic.num.partitions"])
        for d in broker.log_dir.glob(f"**/__consumer_offsets-{p}"):
            shutil.rmtree(d)
        broker.start()
        produce(broker.bootstrap, "forgot", 10, start=10)
        poll_until([member], lambda: set(values_of(member.records)) >= {b"v%d" % i for i in range(20)},
                   timeout_s=40, what="the 10 records after the restart")
        poll_until([member], lambda: any(k == "lost" for k, _ in member.events), timeout_s=30, what="lost")
        produce(broker.bootstrap, "forgot", 10, start=20)
        poll_until([member], lambda: set(values_of(member.records)) >= {b"v%d" % i for i in range(30)},
                   timeout_s=40, what="the 10 records after the loss")
        print(member.events)
    finally:
        consumer.close()
