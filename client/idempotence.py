"""ProducerSequences: the idempotent producer's id and per-partition sequence numbers (the
idempotence half of Kafka's TransactionManager).

Each batch carries (producer id, epoch, base sequence). The partition leader keeps every producer's
last five batches: a batch sent again after a lost response is recognised and answered with the
offsets it got the first time, instead of being appended twice (broker/log/producer_state.py).
What the client must guarantee for that to hold:

- A batch's sequence is assigned once, when it first goes out, in the partition's queue order, and
  it keeps it through every retry. A partition has one request in flight at a time, holding at most
  `MAX_BATCHES_PER_REQUEST` batches (the broker's window of five), and a batch out comes back and
  goes again before any newer one (`PartitionMutes`): the leader sees each partition's sequences
  in order, and a retry only ever repeats the batches the leader saw last.
- A sequence is never given to a second batch. When a batch that holds one fails for good (its
  outcome unknown: it may have been written) or the leader refuses the sequence
  (OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER_ID: it was not written), the producer needs a new id
  and starts every partition's sequences at 0 (Kafka bumps the epoch, KIP-360). It switches only
  once no batch sent under the old id is unresolved: meanwhile those batches may still be retried
  under the old id, and batches that never went out wait (`paused`). A batch refused outright is
  given a new sequence under the new id; it was not written.

Until the first id arrives every batch waits as it does during a switch. I/O thread only.
"""
from __future__ import annotations

from client.producer_batch import ProducerBatch
from common.topic_partition import TopicPartition

# The leader recognises a retry among a producer's last five batches per partition (Kafka's
# ProducerStateEntry.NUM_BATCHES_TO_RETAIN): a request never carries more of one partition.
MAX_BATCHES_PER_REQUEST = 5
INT32_MAX = 2**31 - 1


class ProducerSequences:
    def __init__(self) -> None:
        self.producer_id = -1
        self.epoch = -1
        self._next: dict[TopicPartition, int] = {}
        self.unresolved: set[ProducerBatch] = set()  # sent under the current id, not yet completed
        self.paused: list[ProducerBatch] = []  # held until the next id (never sent under the current one)
        self.reset_needed = True  # no id yet
        self.resetting = False  # an InitProducerId is under way

    def admit(self, batch: ProducerBatch) -> bool:
        """May `batch` go out now? Assigns its sequence on its first admission under this id. A
        batch that may not go is held in `paused` (it never went out under the current id)."""
        if batch.producer is not None and batch.producer[0] == self.producer_id:
            if not self.reset_needed or batch in self.unresolved:
                return True
        if self.reset_needed:
            if batch.producer is not None:
                batch.set_producer(None)  # never sent under that id: a new sequence once the id changes
            self.paused.append(batch)
            return False
        tp = (batch.topic, batch.partition)
        sequence = self._next.get(tp, 0)
        batch.set_producer((self.producer_id, self.epoch, sequence))
        following = sequence + batch.record_count
        self._next[tp] = following if following <= INT32_MAX else following - INT32_MAX - 1  # wraps as Kafka's
        return True

    def sent(self, batch: ProducerBatch) -> None:
        if batch.producer is not None:
            self.unresolved.add(batch)

    def acknowledged(self, batch: ProducerBatch) -> None:
        self.unresolved.discard(batch)

    def failed(self, batch: ProducerBatch) -> None:
        """`batch` failed for good. If it held a sequence, that sequence may or may not be
        written: no later batch may follow it under this id."""
        self.unresolved.discard(batch)
        if batch.producer is not None and batch.producer[0] == self.producer_id:
            self.reset_needed = True

    def refused(self, batch: ProducerBatch) -> None:
        """The leader refused `batch`'s sequence (nothing was written): it goes again with a new
        sequence under a new id."""
        self.unresolved.discard(batch)
        batch.set_producer(None)
        self.reset_needed = True

    @property
    def ready_to_reset(self) -> bool:
        return self.reset_needed and not self.resetting and not self.unresolved

    def install(self, producer_id: int, epoch: int) -> list[ProducerBatch]:
        """The new id is in use: every partition starts at sequence 0. Returns the paused batches,
        oldest first, to queue again."""
        self.producer_id, self.epoch = producer_id, epoch
        self._next.clear()
        self.reset_needed = False
        paused = sorted(self.paused, key=lambda b: b.drain_index)
        self.paused = []
        return paused
