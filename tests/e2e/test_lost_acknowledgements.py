"""Lost acknowledgements force retries of batches the broker already wrote: a proxy in front of one
broker (tests/helpers/lossy_proxy.py) forwards every request and swallows some Produce responses,
closing the client's connection each time. The idempotent producer sends the batches again on a
new connection and the broker recognises them: every value is stored once, in send order, at the
offset its future reports. (Without idempotence the same run stores the retried batches twice.)"""
from __future__ import annotations

import pytest

from client import Admin, Producer
from tests.helpers.lossy_proxy import LossyProxy
from tests.helpers.numbered_sends import NumberedSends, check_exactly_once, read_partitions
from tests.waiting import wait_until

TOPIC = "lost-acks"
ROUND = 100  # records sent before waiting for their outcome
DROP_EVERY = 4  # the proxy swallows every 4th Produce response...
DROPS = 6  # ...until it swallowed 6
ROUNDS_AFTER = 3  # rounds sent once the proxy forwards everything again
MAX_ROUNDS = 300


@pytest.mark.parametrize("acks", [1, "all"], ids=["acks=1", "acks=all"])
def test_batches_retried_after_lost_acknowledgements_are_stored_once(broker_factory, acks):
    """Rounds of numbered records through the proxy while it drops every 4th Produce response, six
    times: every send succeeds, and the log holds each value once, in order, where its future says."""
    with LossyProxy() as proxy:
        broker = broker_factory(**{"advertised.port": proxy.port}).start()
        proxy.forward_to((broker.host, broker.port))
        bootstrap = f"{proxy.host}:{proxy.port}"
        with Admin(bootstrap) as admin:
            admin.create_topic(TOPIC, 1, replication_factor=1)
        sends = NumberedSends(TOPIC)
        # Small batches, so a request often carries several and a lost response loses them all.
        with Producer(bootstrap, acks=acks, linger_ms=1, batch_size=512, retry_backoff_ms=20,
                      request_timeout_ms=10_000, delivery_timeout_ms=120_000) as producer:
            proxy.drop_every(DROP_EVERY, DROPS)
            rounds = after = 0
            while after < ROUNDS_AFTER:
                assert rounds < MAX_ROUNDS, f"only {proxy.dropped} of {DROPS} responses dropped in {rounds} rounds"
                for _ in range(ROUND):
                    sends.send(producer, 0)
                last = sends.futures[-1]
                wait_until(last.done, 60, f"the outcome of round {rounds}")
                rounds += 1
                after += proxy.dropped == DROPS
            producer.flush()
            retried = producer.metrics()["record-retry-total"]
        print(f"{len(sends.futures)} sends in {rounds} rounds; {proxy.dropped} of {proxy.produce_responses} Produce "
              f"responses dropped; {retried:.0f} records retried")
        assert proxy.dropped == DROPS and retried > 0
        assert sends.failed() == []
        check_exactly_once(sends, read_partitions(bootstrap, TOPIC, 1))
