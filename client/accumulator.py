"""RecordAccumulator: per-partition open batches, linger, the queue of sealed batches, and
buffer memory (Kafka's RecordAccumulator); PartitionMutes: per-partition order under retries.

Threads: application threads append (one lock); the producer's I/O thread drains, requeues and
reports completions. What the I/O thread alone touches needs no lock (see RecordAccumulator).
A partition's batches are queued in the order the application handed their records over,
whether one by one (`append`) or as a pre-built Arrow body (`append_body`).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from operator import attrgetter
from time import monotonic as _monotonic
from typing import Callable

import pyarrow as pa

from client.idempotence import ProducerSequences, SequenceWindows
from client.producer_batch import (
    BatchResult,
    DeliveryCallback,
    Headers,
    ProducerBatch,
    RecordFuture,
    new_future,
)
from common.errors import DeliveryTimeoutError
from common.topic_partition import TopicPartition

RECORD_OVERHEAD = 16  # bytes counted per record on top of key + value when sizing batches
TIMER_SLACK_S = 0.0005  # half of uvloop's timer resolution

_drain_index = attrgetter("drain_index")


class PartitionMutes:
    """Per-partition order under retries (max_in_flight=1): Kafka's muted partitions. I/O thread only.

    A partition is muted while any batch of it is out: handed out by the accumulator and neither
    completed nor queued again. Meanwhile its newer batches are held back here; when the last
    batch out comes back (to be retried, or once its connection opened or its leader is known)
    or completes, the partition's batches are released in the order they were first drained,
    to go before anything queued since. A batch out is retried before any newer batch of its
    partition is sent, whether the retry goes to the same leader or a new one.

    Per-batch work only, and only in this mode: the accumulator's drain passes the batches it
    takes through `hand_out`, and its requeue and done report batches back.
    """

    def __init__(self) -> None:
        self.muted: dict[TopicPartition, list[ProducerBatch]] = {}  # partition -> batches held back
        self._out: dict[TopicPartition, int] = {}  # how many batches of each muted partition are out
        self._drained = 0  # batches given a drain_index so far

    def hand_out(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Of `batches` (drained, in queue order), those that may be sent now: every one of a
        partition that was not muted. Those go out together, in order; their partitions are muted.
        The rest are held back."""
        muted = self.muted
        ready = []
        index = self._drained
        for batch in batches:
            if batch.drain_index < 0:
                batch.drain_index = index
                index += 1
            held = muted.get((batch.topic, batch.partition))
            if held is None:
                ready.append(batch)
            else:
                held.append(batch)
        self._drained = index
        out = self._out
        for batch in ready:
            tp = (batch.topic, batch.partition)
            count = out.get(tp)
            if count is None:
                out[tp] = 1
                muted[tp] = []
            else:
                out[tp] = count + 1
        return ready

    def returned(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Batches out that are to be sent again: they rejoin their partitions' held batches.
        Returns the batches of partitions with nothing out any more, to queue at the front."""
        released: list[ProducerBatch] = []
        for batch in batches:
            tp = (batch.topic, batch.partition)
            self.muted[tp].append(batch)
            released += self._one_back(tp)
        return released

    def completed(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """A batch out succeeded or failed for good; like `returned`."""
        return self._one_back((batch.topic, batch.partition))

    def busy(self, sending: Mapping[TopicPartition, int] | None) -> Mapping[TopicPartition, object]:
        """The partitions whose open batch waits: the muted ones (a batch of theirs is out)."""
        return self.muted

    def _one_back(self, tp: TopicPartition) -> list[ProducerBatch]:
        count = self._out[tp] - 1
        if count:
            self._out[tp] = count
            return []
        del self._out[tp]
        held = self.muted.pop(tp)
        # Drain order is queue order. Batches out in several groups (two requests, or a retry
        # group and batches without an in-flight slot) may come back in any order.
        held.sort(key=_drain_index)
        return held


class RecordAccumulator:
    """Per-partition open batches plus the queue of sealed ones, shared by the application's
    threads (append) and the producer's I/O thread (drain, done).

    Appends take one lock. The I/O thread takes it only to seal open batches that lingered out
    (and to count the sealed batches queued before them): taking sealed batches (a deque) and
    accounting completed ones (counters only it writes) need no lock. That matters under the
    GIL: a thread switched out while holding the lock makes the other wait for the GIL's next
    hand-over, up to the 5 ms switch interval, so an application in a tight send() loop and the
    sender would otherwise stall each other.

    With `in_order` (max_in_flight=1) it mutes partitions as Kafka's accumulator does: see
    PartitionMutes. With `sequences` (an idempotent producer) it keeps each partition's batches
    out within the leader's window of five instead: see client/idempotence.py's SequenceWindows.
    """

    def __init__(self, batch_size: int, linger_ms: int, buffer_memory: int,
                 on_batch: Callable[[str, int, bool], None], in_order: bool = False,
                 sequences: ProducerSequences | None = None) -> None:
        self.on_batch = on_batch
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        # linger_ms=0 sends whatever accumulated by the time the sender looks: never seal on age.
        self.seal_after_s = self.linger_s or math.inf
        self.buffer_memory = buffer_memory
        self.lock = threading.Lock()
        self.space = threading.Condition(threading.Lock())  # waited on while buffer_memory is full
        self.waiting_for_space = 0
        self.open: dict[TopicPartition, ProducerBatch] = {}
        self.sealed: deque[ProducerBatch] = deque()
        self.appended_bytes = 0  # written under `lock`
        self.completed_bytes = 0  # written by the I/O thread only
        self.incomplete: set[BatchResult] = set()
        self.mutes: PartitionMutes | SequenceWindows | None = None
        if sequences is not None:
            self.mutes = SequenceWindows(sequences)
        elif in_order:
            self.mutes = PartitionMutes()

    @property
    def buffered_bytes(self) -> int:
        return self.appended_bytes - self.completed_bytes

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp: int,
               headers: Headers, on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Add one record and return its future. Opening a batch (the loop must learn its linger
        deadline) or sealing one (ready to send) calls `on_batch(topic, partition, sealed)`."""
        size = (len(key) if key else 0) + (len(value) if value else 0) + RECORD_OVERHEAD
        tp = (topic, partition)
        with self.lock:
            batch = self.open.get(tp)
            if batch is None:
                batch = self.open[tp] = ProducerBatch(topic, partition)
                self.incomplete.add(batch.result)
                self.on_batch(topic, partition, False)
            index = len(batch.values)
            batch.keys.append(key)
            batch.values.append(value)
            batch.timestamps.append(timestamp)
            if headers is not None or batch.headers is not None:
                if batch.headers is None:
                    batch.headers = [None] * index
                batch.headers.append(headers)
            if on_delivery is not None or batch.result.callbacks is not None:
                callbacks = batch.result.callbacks
                if callbacks is None:
                    callbacks = batch.result.callbacks = [None] * index
                callbacks.append(on_delivery)
            batch.size += size
            self.appended_bytes += size
            # Sealing a lingered-out batch here, rather than only when the sender's timer fires,
            # keeps linger_ms precise under load: event-loop timers have millisecond resolution.
            if batch.size >= self.batch_size or _monotonic() >= batch.created + self.seal_after_s:
                self._seal_open(tp)
                self.on_batch(topic, partition, True)
            return new_future(RecordFuture, (batch.result, index, timestamp))

    def append_body(self, topic: str, partition: int, body: pa.RecordBatch) -> BatchResult:
        """Queue an already-built Arrow body as one sealed batch (the columnar path), behind the
        partition's open batch, which is sealed first: a partition's records are written in the
        order the application handed them over, whether by `append` or here (as Kafka's
        accumulator keeps one queue per partition in call order). Queued ahead of the open batch,
        the body took the lower offsets."""
        batch = ProducerBatch(topic, partition, body)
        tp = (topic, partition)
        with self.lock:
            self.incomplete.add(batch.result)
            self.appended_bytes += batch.size
            if tp in self.open:
                self._seal_open(tp)
            self.sealed.append(batch)
        return batch.result

    def _seal_open(self, tp: TopicPartition) -> None:
        """Move the partition's open batch to the sealed queue, its record count now final. Under `lock`."""
        batch = self.open.pop(tp)
        batch.record_count = len(batch.values)
        self.sealed.append(batch)

    def drain(self, force: bool = False, busy: Mapping[TopicPartition, int] | None = None
              ) -> tuple[list[ProducerBatch], float | None]:
        """Sealed batches plus open ones past linger (all open ones with `force`), and the time
        until the next open batch lingers out (None if none is waiting on a timer). I/O thread only.

        An open batch whose partition is in `busy` (a request carrying that partition is in
        flight) stays open even past linger: it goes when that request completes, carrying every
        record that arrived meanwhile. That is how small batches form without a timer: with
        linger_ms 0 a lone record still goes at once, but records arriving faster than the
        broker answers share requests instead of each paying a request's cost (Kafka's sender
        batches the same way, by being busy). Full batches never wait for it.

        A batch due within TIMER_SLACK_S counts as due: uvloop's timers have millisecond
        resolution and turn shorter waits into immediate callbacks, so waiting for it would spin.

        The sealed batches handed out are those queued when the lock was taken: an application
        thread may seal a partition's batch and open its next one at any moment, and that next
        one, if taken here, must not go without the one sealed before it.

        In order (max_in_flight=1), batches of muted partitions are held back (PartitionMutes),
        and a muted partition's open batch stays open as a busy one's does.
        """
        sealed = self.sealed
        mutes = self.mutes
        if not self.open:
            ready = [sealed.popleft() for _ in range(len(sealed))]
            return (ready if mutes is None else mutes.hand_out(ready)), None
        if mutes is not None:
            busy = mutes.busy(busy)  # muted partitions: a batch out (in order), a full window or a retry pending
        next_due = None
        expired = []
        with self.lock:
            # The clock is read under the lock: a batch opened just before it was taken is judged
            # against a time after its creation (linger 0: due), however long the wait for the lock.
            now = time.monotonic()
            count = len(sealed)
            for tp, batch in list(self.open.items()):
                due = batch.created + self.linger_s - now
                if force or (due <= TIMER_SLACK_S and not (busy and tp in busy)):
                    del self.open[tp]
                    batch.record_count = len(batch.values)
                    expired.append(batch)
                elif due > TIMER_SLACK_S:
                    next_due = due if next_due is None else min(next_due, due)
        # Only this thread takes from the left (appends go to the right): the first `count` are
        # the ones counted under the lock.
        ready = [sealed.popleft() for _ in range(count)]
        if expired:
            ready += expired
        return (ready if mutes is None else mutes.hand_out(ready)), next_due

    def requeue(self, batches: list[ProducerBatch]) -> None:
        """Batches drained are to go again, before anything queued since (I/O thread)."""
        if self.mutes is not None:
            batches = self.mutes.returned(batches)
        self.sealed.extendleft(reversed(batches))

    def queue_first(self, batches: list[ProducerBatch]) -> None:
        """Batches that waited outside the queue (paused for a producer id) go before anything
        queued since (I/O thread)."""
        self.sealed.extendleft(reversed(batches))

    def done(self, batch: ProducerBatch) -> bool:
        """`batch` completed (I/O thread): its bytes leave buffer_memory. True when that unmuted
        its partition and queued batches held back behind it: the sender has work."""
        self.incomplete.discard(batch.result)
        self.completed_bytes += batch.size
        if self.waiting_for_space:
            with self.space:
                self.space.notify_all()
        if self.mutes is not None:
            released = self.mutes.completed(batch)
            if released:
                self.sealed.extendleft(reversed(released))
                return True
        return False

    def wait_for_space(self, timeout_s: float) -> None:
        """Block the calling application thread until buffer_memory has room, up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.space:
            self.waiting_for_space += 1
            try:
                while self.buffered_bytes >= self.buffer_memory:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeliveryTimeoutError(f"buffer_memory full for {timeout_s}s (max_block_ms)")
                    self.space.wait(min(remaining, 0.1))
            finally:
                self.waiting_for_space -= 1

    def has_room(self) -> bool:
        return self.buffered_bytes < self.buffer_memory


