"""ProducerBatch's result without a broker: waiters racing its completion."""
from __future__ import annotations

import threading

from client.producer_batch import BatchResult


def test_threads_waiting_on_a_batch_around_its_completion_all_return():
    """A batch's event is made by its first waiter (most batches are never waited on); waiters
    racing each other and the completion must all see it complete, none wait forever."""
    for _ in range(300):
        result = BatchResult("t", 0)
        returned: list[int] = []
        waiters = [threading.Thread(target=lambda: (result.wait(5), returned.append(1))) for _ in range(3)]
        for waiter in waiters:
            waiter.start()
        result.complete(7)
        for waiter in waiters:
            waiter.join(6)
        assert len(returned) == 3
