"""A partition leader that hangs (SIGSTOP) under a steady acks=all producer (issue 38 item 2).

The produce in flight to it times out after request_timeout_ms. The cluster moves the partition
only once the hung broker's session times out (here 6 s, longer than the 3 s request timeout), so
a retry sent to it after the back-off would wait out a second request timeout. The producer must
instead hold the batches until the broker answers or the partition moves, then send them to the
new leader: one Produce request to it times out, not two.

Counted per broker, from the producer's log line for each broker that lets a Produce request time
out, from the pause until every record is delivered with the broker still stopped (a batch resent
to it would have timed out by then). Under load a healthy broker may also let one time out, before
the pause (the leader slow to gather its followers' acks within the request timeout) or after it
(the new leader): that is not the hung leader's cost.
"""
from __future__ import annotations

import logging
import time

import pytest

from client import Admin, Producer
from tests.helpers.cluster_scenarios import partitions_of, wait_for, wait_for_full_isr

TOPIC = "hung-leader"
REQUEST_TIMEOUT_MS = 3_000
SESSION_TIMEOUT_MS = 6_000  # the broker default: a hung leader's partitions move 4-6 s after the pause
SEND_INTERVAL_S = 0.005
DEADLINE_S = 60.0


def produce_timeouts(records: list[logging.LogRecord]) -> dict[int, int]:
    """Per broker, the Produce requests it let time out, from the producer's log records."""
    counts: dict[int, int] = {}
    for record in records:
        if record.name == "pymq.producer" and record.msg.startswith("broker %d let a Produce request time out"):
            node = record.args[0]  # type: ignore[index]
            counts[node] = counts.get(node, 0) + 1
    return counts


def test_a_hung_leader_costs_one_request_timeout_not_two(cluster, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="pymq.producer")
    local = cluster(3, **{"broker.session.timeout.ms": SESSION_TIMEOUT_MS})
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
        victim_id = wait_for_full_isr(admin, TOPIC)[0].leader
    victim = local.brokers[victim_id]
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not victim)

    acked_after_pause: list[float] = []
    errors: list[BaseException] = []

    def delivered(metadata, error, after_pause: bool) -> None:
        if error is not None:
            errors.append(error)
        elif after_pause and not acked_after_pause:
            acked_after_pause.append(time.monotonic())

    with Producer(local.bootstrap, acks="all", linger_ms=1, request_timeout_ms=REQUEST_TIMEOUT_MS,
                  delivery_timeout_ms=120_000) as producer:
        for _ in range(200):  # a second of steady traffic, every record acknowledged by the leader
            producer.send(TOPIC, b"before", partition=0, on_delivery=lambda md, err: delivered(md, err, False))
            time.sleep(SEND_INTERVAL_S)  # pacing, not a wait: steady traffic
        producer.flush()
        try:
            timed_out_before = produce_timeouts(caplog.records)
            logged_before = len(caplog.records)
            victim.pause()
            paused_at = time.monotonic()
            while not acked_after_pause and time.monotonic() - paused_at < DEADLINE_S:
                producer.send(TOPIC, b"after", partition=0, on_delivery=lambda md, err: delivered(md, err, True))
                time.sleep(SEND_INTERVAL_S)  # pacing, not a wait: steady traffic until one is acknowledged
            with Admin(survivors, request_timeout_ms=5_000) as admin:
                def moved():
                    state = partitions_of(admin, TOPIC)[0]
                    return state if state.leader not in (-1, victim_id) else None
                new_leader = wait_for(moved, 60, "another broker to lead partition 0").leader
            # Every record delivered while the victim still hangs: one resent to it would time out again.
            producer.flush(timeout_s=DEADLINE_S)
            timed_out = produce_timeouts(caplog.records[logged_before:])
        finally:
            victim.resume()

    assert acked_after_pause, f"no record sent after the pause was acknowledged within {DEADLINE_S} s"
    print(f"first acknowledgement {acked_after_pause[0] - paused_at:.2f} s after pausing broker {victim_id} "
          f"(broker {new_leader} leads now); Produce requests timed out per broker: {timed_out} "
          f"(before the pause: {timed_out_before})")
    # Acknowledged while the victim was stopped: by the new leader. The produce in flight at the
    # pause timed out; nothing was resent to the hung broker to time out again.
    assert timed_out.get(victim_id) == 1, \
        f"{timed_out.get(victim_id, 0)} Produce requests to the hung leader {victim_id} timed out " \
        f"(one request timeout each); per broker: {timed_out}"
    assert not errors, errors[:3]
