"""The idempotent producer's client side (the idempotence half of Kafka's TransactionManager):
`ProducerSequences`, its producer id and per-partition sequence numbers, and `SequenceWindows`, the
order its batches go out in.

Each batch carries (producer id, epoch, base sequence). The partition leader keeps every producer's
last five batches: a batch sent again after a lost response is recognised and answered with the
offsets it got the first time, instead of being appended twice (broker/log/producer_state.py).
What the client must guarantee for that to hold:

- A batch's sequence is assigned once, when it first goes out, in the partition's queue order, and
  it keeps it through every retry.
- Every batch a partition has out lies within a window of five consecutive batches that starts at
  its oldest batch not yet acknowledged (`SequenceWindows`; Kafka's max.in.flight of five with one
  batch per partition per request). Whatever the leader wrote after that oldest batch is within
  those five, so a retry of it always finds it among the leader's last five. Several requests of a
  partition may be out at once, as without idempotence.
- When a batch comes back to be retried, the leader may have refused the batches after it
  (OUT_OF_ORDER_SEQUENCE: a gap, nothing written), so its partition stops: nothing newer goes until
  every batch it had out is back or acknowledged, and then those come back go again first, in
  sequence order. OUT_OF_ORDER_SEQUENCE for a batch with an older one unacknowledged is that case
  and is retried like any retriable error.
- A sequence is never given to a second batch. When a batch that holds one fails for good (its
  outcome unknown: it may have been written) or the leader refuses the sequence of a partition's
  oldest unacknowledged batch (OUT_OF_ORDER_SEQUENCE, UNKNOWN_PRODUCER_ID: it was not written),
  the producer needs a new id and starts every partition's sequences at 0 (Kafka bumps the epoch,
  KIP-360). It switches only once no batch sent under the old id is unresolved: meanwhile those
  batches may still be retried under the old id, and batches that never went out wait (`paused`).
  A batch refused outright is given a new sequence under the new id; it was not written.

Until the first id arrives every batch waits as it does during a switch. I/O thread only.
"""
from __future__ import annotations

from collections import ChainMap, deque
from collections.abc import Callable, Mapping
from operator import attrgetter

from client.producer_batch import ProducerBatch
from common.errors import PymqError
from common.topic_partition import TopicPartition

# The leader recognises a retry among a producer's last five batches per partition (Kafka's
# ProducerStateEntry.NUM_BATCHES_TO_RETAIN): the window a partition's batches out must lie in.
WINDOW = 5
INT32_MAX = 2**31 - 1


class ProducerSequences:
    """`transactional`: the id comes from the transaction coordinator (client/transactions.py) and
    is never renewed here; a failure makes the transaction abortable instead (`on_failure`), and
    a partition's batches wait until it joined the transaction (`added`; `to_add` are wanted)."""

    def __init__(self, transactional: bool = False) -> None:
        self.transactional = transactional
        self.added: set[TopicPartition] = set()
        self.to_add: set[TopicPartition] = set()
        self.on_failure: Callable[[PymqError], None] | None = None
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
        if batch.producer is not None and batch.producer[:2] == (self.producer_id, self.epoch):
            if not self.reset_needed or batch in self.unresolved:
                return True
        if self.reset_needed:
            if batch.producer is not None:
                batch.set_producer(None)  # never sent under that id: a new sequence once the id changes
            self.paused.append(batch)
            return False
        tp = (batch.topic, batch.partition)
        if self.transactional and tp not in self.added:
            self.to_add.add(tp)
            self.paused.append(batch)
            return False
        sequence = self._next.get(tp, 0)
        batch.set_producer((self.producer_id, self.epoch, sequence), self.transactional)
        following = sequence + batch.record_count
        self._next[tp] = following if following <= INT32_MAX else following - INT32_MAX - 1  # wraps as Kafka's
        return True

    def sent(self, batch: ProducerBatch) -> None:
        if batch.producer is not None:
            self.unresolved.add(batch)

    def acknowledged(self, batch: ProducerBatch) -> None:
        self.unresolved.discard(batch)

    def failed(self, batch: ProducerBatch, err: PymqError) -> None:
        """`batch` failed for good. If it held a sequence, that sequence may or may not be
        written: no later batch may follow it under this id (a transactional producer's
        transaction must abort instead)."""
        self.unresolved.discard(batch)
        if batch.producer is not None and batch.producer[:2] == (self.producer_id, self.epoch):
            if self.transactional:
                if self.on_failure is not None:
                    self.on_failure(err)
            else:
                self.reset_needed = True

    def refused(self, batch: ProducerBatch) -> None:
        """The leader refused `batch`'s sequence (nothing was written): it goes again with a new
        sequence under a new id."""
        self.unresolved.discard(batch)
        batch.set_producer(None)
        self.reset_needed = True

    @property
    def ready_to_reset(self) -> bool:
        return self.reset_needed and not self.resetting and not self.unresolved and not self.transactional

    def release_added(self) -> list[ProducerBatch]:
        """The paused batches whose partitions joined the transaction, oldest first, to queue again."""
        ready = [b for b in self.paused if (b.topic, b.partition) in self.added]
        self.paused = [b for b in self.paused if (b.topic, b.partition) not in self.added]
        return sorted(ready, key=_drain_index)

    def take_paused(self) -> list[ProducerBatch]:
        paused, self.paused = self.paused, []
        return paused

    def install(self, producer_id: int, epoch: int, held: list[ProducerBatch]) -> list[ProducerBatch]:
        """The new id is in use: every partition starts at sequence 0. Returns the paused batches
        and `held` (those the windows held back), oldest first, to queue again."""
        self.producer_id, self.epoch = producer_id, epoch
        self._next.clear()
        self.reset_needed = False
        waiting = sorted([*self.paused, *held], key=_drain_index)
        self.paused = []
        return waiting


_drain_index = attrgetter("drain_index")


class SequenceWindows:
    """Which of an idempotent producer's batches may go out, per partition (the module docstring
    says why): the accumulator's drain passes the batches it takes through `hand_out`, and its
    requeue (`returned`) and done (`completed`) report them back, as for PartitionMutes.

    Per partition: `_window`, its batches handed out and not yet acknowledged, oldest first
    (acknowledged ones leave from the front; one acknowledged behind an older one waits there);
    `_out`, how many of those are out now; `muted`, its batches held back while its window is full
    or it has batches coming back. Per-batch work only."""

    def __init__(self, sequences: ProducerSequences) -> None:
        self.sequences = sequences
        self.muted: dict[TopicPartition, list[ProducerBatch]] = {}
        self._window: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._out: dict[TopicPartition, int] = {}
        self._returning: set[TopicPartition] = set()  # batches came back: hold the rest until all are
        self._drained = 0

    def busy(self, sending: Mapping[TopicPartition, int] | None) -> Mapping[TopicPartition, object]:
        """The partitions whose open batch waits: those with a request in flight (as without
        idempotence) and the muted ones."""
        return self.muted if not sending else ChainMap(self.muted, sending)  # type: ignore[arg-type]

    def hand_out(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Of `batches` (drained, in queue order), those that may go now: a batch already in its
        partition's window (coming back), or a new one while the window has room and the
        sequences admit it. The others are held back (or paused by the sequences)."""
        ready = []
        index = self._drained
        muted, windows, out, sequences = self.muted, self._window, self._out, self.sequences
        for batch in batches:
            if batch.drain_index < 0:
                batch.drain_index = index
                index += 1
            tp = (batch.topic, batch.partition)
            held = muted.get(tp)
            if held is not None:
                held.append(batch)
                continue
            window = windows.get(tp)
            again = window is not None and batch in window  # going again: it holds its place
            if not again and window is not None and len(window) >= WINDOW:
                muted[tp] = [batch]
                continue
            if not sequences.admit(batch):
                continue
            if not again:
                if window is None:
                    window = windows[tp] = deque()
                window.append(batch)
            out[tp] = out.get(tp, 0) + 1
            ready.append(batch)
        self._drained = index
        return ready

    def returned(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Batches out that are to go again: their partitions hold everything newer until every
        batch they have out is back. Returns what is released, to queue at the front."""
        released: list[ProducerBatch] = []
        for batch in batches:
            tp = (batch.topic, batch.partition)
            self._returning.add(tp)
            self.muted.setdefault(tp, []).append(batch)
            self._out[tp] -= 1
            released += self._maybe_release(tp)
        return released

    def completed(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """A batch out was acknowledged or failed for good: the window moves past the
        acknowledged batches at its front. Returns what is released."""
        tp = (batch.topic, batch.partition)
        window = self._window.get(tp)
        if window is None or batch not in window:
            return []  # never handed out (it was paused): nothing moves
        self._out[tp] -= 1
        while window and window[0].result.completed:
            window.popleft()
        return self._maybe_release(tp)

    def earlier_unacknowledged(self, batch: ProducerBatch) -> bool:
        """Whether an older batch of `batch`'s partition is not acknowledged yet (a refused
        sequence then only means that batch was not written either)."""
        window = self._window.get((batch.topic, batch.partition), ())
        for other in window:
            if other is batch:
                return False
            if not other.result.completed:
                return True
        return False

    def forget(self) -> list[ProducerBatch]:
        """A new producer id (no batch is out): every batch not acknowledged gets a new sequence
        when it goes again, in new windows. Returns the batches held back, to queue again."""
        self._window.clear()
        self._returning.clear()
        held = [batch for batches in self.muted.values() for batch in batches]
        self.muted.clear()
        return held

    def _maybe_release(self, tp: TopicPartition) -> list[ProducerBatch]:
        out = self._out[tp]
        if not out:
            del self._out[tp]
            if not self._window.get(tp, True):
                del self._window[tp]
        if tp in self._returning:
            if out:
                return []
            self._returning.discard(tp)
        elif len(self._window.get(tp, ())) >= WINDOW:
            return []
        held = self.muted.pop(tp, None)
        if not held:
            return []
        held.sort(key=_drain_index)  # queue order: batches back from several requests come in any order
        return held
