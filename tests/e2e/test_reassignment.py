"""Reassignment and decommission on a 4-broker cluster under load: replicas and leadership move
to other brokers, the new replicas hold the leader's log byte for byte, the old ones delete
theirs, and nothing acknowledged is lost. A move onto a broker at `max.partitions` is refused."""
from __future__ import annotations

import pytest

from cli.partition import decommission_plan
from client import Admin
from common.errors import PolicyViolationError
from tests.e2e.checker import History
from tests.helpers.cluster_scenarios import Load, partitions_of, read_all, wait_for, wait_for_full_isr

TOPIC = "moving"


def log_bytes(log_dir, partition: int) -> bytes | None:
    directory = log_dir / f"{TOPIC}-{partition}"
    if not directory.exists():
        return None
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def test_a_reassignment_and_a_decommission_move_data_and_leadership_losing_nothing(cluster):
    local = cluster(4, **{"replica.throttle.bytes.per.second": 2 << 20})
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 4, replication_factor=2, configs={"min.insync.replicas": 2})
        before = wait_for_full_isr(admin, TOPIC)
        load = Load(local.bootstrap, history, TOPIC)
        load.start()
        load.wait_acked(2000)

        # Move partition 0 entirely to the two brokers that do not hold it: leadership follows.
        old = before[0].replicas
        target = tuple(b for b in range(4) if b not in old)
        admin.alter_partition_reassignments({(TOPIC, 0): target})
        moved = wait_for(lambda: (lambda p: p if p.replicas == target and not p.target_replicas else None)(
            partitions_of(admin, TOPIC)[0]), 60, f"partition 0 to move to {target}")
        assert moved.leader in target and set(moved.isr) == set(target) and moved.leader_epoch > before[0].leader_epoch
        wait_for(lambda: all(log_bytes(local.brokers[b].log_dir, 0) is None for b in old), 30,
                 "the old replicas to delete their logs")

        # Decommission broker 3: every replica it holds moves to the others.
        moves = decommission_plan(admin.describe_cluster(), 3)
        assert moves and all(3 not in replicas for replicas in moves.values())
        admin.alter_partition_reassignments(moves)
        wait_for(lambda: all(3 not in p.replicas and not p.target_replicas for p in partitions_of(admin, TOPIC).values()),
                 60, "broker 3 to hold no replica")
        assert all(p.leader != 3 for p in partitions_of(admin, TOPIC).values())
        load.finish()
        final = wait_for_full_isr(admin, TOPIC)
    assert not history.failed, f"{len(history.failed)} sends failed, e.g. {list(history.failed.items())[:3]}"
    for p, state in final.items():
        copies = {log_bytes(local.brokers[b].log_dir, p) for b in state.replicas}
        wait_for(lambda p=p, state=state: len({log_bytes(local.brokers[b].log_dir, p) for b in state.replicas}) == 1,
                 30, f"the replicas of partition {p} to be equal byte for byte")
        assert None not in copies
    local.brokers[3].stop()  # decommissioned: stopping it loses nothing
    read_all(local.bootstrap, TOPIC, 4, history, "final")
    report = history.check(allow_duplicates=True)
    print(f"reassignment: {report}")
    assert report.ok and report.acknowledged == load.sent, str(report)


def test_a_reassignment_onto_a_broker_at_max_partitions_is_refused_with_policy_violation(cluster):
    """max.partitions 20 on 3 brokers holding 20, 20 and 19 single-replica partitions: a move
    onto the one with 19 is accepted, the next onto it is refused POLICY_VIOLATION (naming the
    broker and the limit) and leaves the partition where it was."""
    local = cluster(3, **{"max.partitions": 20})
    with Admin(local.bootstrap) as admin:
        admin.create_topic("limited", 59, replication_factor=1)
        states = wait_for_full_isr(admin, "limited")
        on = {b: [p for p, s in states.items() if s.replicas == (b,)] for b in range(3)}
        roomy = next(b for b in range(3) if len(on[b]) == 19)
        first, second = (b for b in range(3) if b != roomy)
        admin.alter_partition_reassignments({("limited", on[first][0]): (roomy,)})
        with pytest.raises(PolicyViolationError, match=f"21 partition replicas on broker {roomy}.*max.partitions is 20"):
            admin.alter_partition_reassignments({("limited", on[second][0]): (roomy,)})
        refused = partitions_of(admin, "limited")[on[second][0]]
        assert refused.replicas == (second,) and not refused.target_replicas
