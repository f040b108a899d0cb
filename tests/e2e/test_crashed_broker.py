"""A SIGKILLed broker is declared dead by its peers at once (broker/cluster/peer_watch.py), not
after its session timeout (issue 38 item 2): with a session of 60 s, the controller, which also
leads partitions, is killed; a successor controls and every partition it led has a new leader
and acknowledges acks=all produces well within the session, and the killed broker, restarted,
registers again at once instead of waiting for its old lease to run out."""
from __future__ import annotations

import time

from client import Admin, Producer
from tests.helpers.cluster_scenarios import partitions_of, wait_for, wait_for_full_isr

TOPIC = "crashed"
SESSION_MS = 60_000
WITHIN_S = 30  # well inside the session: only the peers' watch can have ended the registration


def test_a_killed_controller_and_leader_is_replaced_long_before_its_session_ends(cluster):
    local = cluster(3, **{"broker.session.timeout.ms": SESSION_MS})
    with Admin(local.bootstrap, request_timeout_ms=5_000) as admin:
        admin.create_topic(TOPIC, 6, replication_factor=3, configs={"min.insync.replicas": 2})
        states = wait_for_full_isr(admin, TOPIC)
        [victim_id] = wait_for(lambda: (lambda c: [c] if c >= 0 else None)(admin.describe_cluster().controller_id),
                               30, "a controller")
    led = sorted(p for p, s in states.items() if s.leader == victim_id)
    assert led, f"the controller {victim_id} leads none of {states}: the topic's leaders are spread over the brokers"
    victim = local.brokers[victim_id]
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not victim)

    victim.kill()
    killed_at = time.monotonic()
    with Admin(survivors, request_timeout_ms=5_000) as admin:
        def moved():
            cluster_now = admin.describe_cluster()
            parts = partitions_of(admin, TOPIC)
            done = (cluster_now.controller_id not in (-1, victim_id)
                    and all(parts[p].leader not in (-1, victim_id) and victim_id not in parts[p].isr for p in led))
            return parts if done else None
        wait_for(moved, WITHIN_S, f"a new controller and new leaders for partitions {led} of the killed broker")
    with Producer(survivors, acks="all", request_timeout_ms=10_000, delivery_timeout_ms=WITHIN_S * 1000) as producer:
        for p in led:
            producer.send(TOPIC, b"after the kill", partition=p).result(WITHIN_S)
    assert time.monotonic() - killed_at < WITHIN_S

    victim.start()  # its old lease was revoked: no waiting up to the session timeout to register again
    with Admin(local.bootstrap, request_timeout_ms=5_000) as admin:
        wait_for_full_isr(admin, TOPIC, WITHIN_S)
    assert "its process is gone" in "".join(b.log_tail(20_000) for b in local.brokers if b is not victim)
