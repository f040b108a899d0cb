"""RecordAccumulator and PartitionMutes without a broker: sealing on linger, drain order under a
concurrent append, and the release order of a muted partition's batches."""
from __future__ import annotations

import threading
import time

import pytest

from client.accumulator import PartitionMutes, RecordAccumulator
from client.producer_batch import ProducerBatch


class HookedLock:
    """The accumulator's lock, running `hook` once just before it is next taken."""

    def __init__(self, lock, hook):
        self.lock, self.hook = lock, hook

    def __enter__(self):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_a_batch_sealed_while_the_sender_drains_goes_before_the_batch_opened_after_it():
    """Just before the sender takes the lock to collect lingered-out open batches, an application
    thread fills batch [a, b] (sealed) and opens [c] on the same partition, due at once
    (linger_ms=0): the sender hands out [a, b] and then [c], not [c] alone first."""
    accumulator = RecordAccumulator(batch_size=40, linger_ms=0, buffer_memory=1 << 30,
                                    on_batch=lambda topic, partition, sealed: None)
    accumulator.append("t", 0, None, b"a" * 10, 1, None)  # 26 bytes of 40: open

    def application_thread_appends():
        def append():
            accumulator.append("t", 0, None, b"b" * 10, 2, None)  # 52 bytes: sealed
            accumulator.append("t", 0, None, b"c" * 10, 3, None)  # a new open batch
        thread = threading.Thread(target=append)
        thread.start()
        thread.join(5)

    accumulator.lock = HookedLock(accumulator.lock, application_thread_appends)
    first, _ = accumulator.drain()
    second, _ = accumulator.drain()
    assert ([b.timestamps for b in first], second) == ([[1, 2], [3]], [])


def test_muted_partition_releases_its_batches_in_drain_order_whatever_order_they_come_back_in():
    """Batches a, b of partition 0 are out, c and d are drained meanwhile and held back (partition
    1's batch is not). b comes back before a; later c and d come back while b is still out: each
    time partition 0 is released once nothing of it is out, its batches in drain order."""
    mutes = PartitionMutes()
    a, b, c, d = (ProducerBatch("t", 0) for _ in range(4))
    other = ProducerBatch("t", 1)
    assert mutes.hand_out([a, b]) == [a, b]
    assert mutes.hand_out([c, other, d]) == [other]  # c and d wait; partition 1 was not muted
    assert mutes.returned([b]) == []  # a is still out
    assert mutes.returned([a]) == [a, b, c, d]
    assert mutes.hand_out([a, b, c, d]) == [a, b, c, d]
    assert mutes.completed(a) == []
    assert mutes.returned([c, d]) == []  # b is still out
    assert mutes.completed(b) == [c, d]
    assert mutes.completed(other) == []
    assert mutes.muted == {}


@pytest.mark.parametrize("linger_ms, sealed_by_age", [(20, True), (0, False)])
def test_a_record_appended_after_linger_seals_its_batch(linger_ms, sealed_by_age):
    """Under load the batch that has lingered long enough is sealed by the append that finds it
    so (linger stays precise whatever the event loop's timer resolution); with linger_ms=0 a batch
    is never sealed on age: the sender takes whatever accumulated when it looks."""
    calls: list[bool] = []
    accumulator = RecordAccumulator(batch_size=1 << 20, linger_ms=linger_ms, buffer_memory=1 << 30,
                                    on_batch=lambda topic, partition, sealed: calls.append(sealed))
    accumulator.append("t", 0, None, b"a", 1, None)
    time.sleep(0.03)  # not a condition, the point: the first record lingers 30 ms
    accumulator.append("t", 0, None, b"b", 1, None)
    assert calls == ([False, True] if sealed_by_age else [False])
    assert [b.record_count for b in accumulator.sealed] == ([2] if sealed_by_age else [])
