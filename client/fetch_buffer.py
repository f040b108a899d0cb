"""FetchBuffer: fetched records waiting for poll, one queue per partition (Kafka's FetchBuffer).

Each partition's decoded batches queue in offset order, possibly ending in an error marker (a
corrupt batch, or a broker's non-retriable error for the partition) that the poll reaching it
raises. A poll takes from the partitions in turn, starting with the one least recently taken
from: it drains the current partition up to the poll's limit and moves on to the next; a partition
that still has records once the limit is reached goes to the back, so the next poll starts with
another one. With a small `max_poll_records` no partition waits for another to be drained (Kafka's
FetchCollector with `SubscriptionState.movePartitionToEnd`), while each partition's records come
in order, each once.

Holds values only: the fetcher calls every method with the subscription state's `lock` held.
"""
from __future__ import annotations

from collections import deque

from client.decoder import FetchedBatch
from common.errors import PymqError
from common.topic_partition import TopicPartition

# A batch and the buffer bytes it counts for, or an error marker (which counts for none).
Entry = tuple[FetchedBatch | PymqError, int]


class FetchBuffer:
    def __init__(self) -> None:
        # Insertion order is the order polls take from the partitions in (the next one first).
        self._queues: dict[TopicPartition, deque[Entry]] = {}
        self.bytes = 0  # buffered bytes, as counted by the fetcher when it decoded them

    def __bool__(self) -> bool:
        return bool(self._queues)

    def partitions(self) -> set[TopicPartition]:
        """The partitions with anything buffered (records or an error marker)."""
        return set(self._queues)

    def extend(self, tp: TopicPartition, entries: list[Entry]) -> None:
        """Queue `entries` after what `tp` has buffered; a partition new to the buffer goes last."""
        if not entries:
            return
        self._queues.setdefault(tp, deque()).extend(entries)
        self.bytes += sum(size for _, size in entries)

    def drop(self, tps: set[TopicPartition]) -> None:
        """Forget what `tps` have buffered."""
        for tp in tps & self._queues.keys():
            self.bytes -= sum(size for _, size in self._queues.pop(tp))

    def clear(self) -> None:
        self._queues.clear()
        self.bytes = 0

    def take(self, limit: float) -> list[tuple[TopicPartition, FetchedBatch, int]]:
        """Up to `limit` rows (see the module docstring), as (partition, batch, bytes it counted
        for), each partition's in order. A batch larger than what is left of `limit` is split: its
        rest stays at the front of its queue with its share of the bytes. Error markers stay."""
        taken: list[tuple[TopicPartition, FetchedBatch, int]] = []
        remaining = limit
        for tp in list(self._queues):
            if remaining <= 0:
                break
            queue = self._queues[tp]
            took = False
            while queue and remaining > 0 and not isinstance(queue[0][0], PymqError):
                batch, size = queue.popleft()
                assert isinstance(batch, FetchedBatch)
                if batch.num_rows > remaining:
                    keep = int(remaining)
                    share = size * keep // batch.num_rows
                    batch, rest = batch.split(keep)
                    queue.appendleft((rest, size - share))
                    size = share
                self.bytes -= size
                taken.append((tp, batch, size))
                remaining -= batch.num_rows
                took = True
            if not queue:
                del self._queues[tp]
            elif took:
                self._queues[tp] = self._queues.pop(tp)  # records left: the others come first next time
        return taken

    def blocked(self) -> list[tuple[TopicPartition, PymqError]]:
        """The partitions whose next buffered entry is an error marker, in take order, with it."""
        return [(tp, queue[0][0]) for tp, queue in self._queues.items() if isinstance(queue[0][0], PymqError)]

    def pop_error(self, tp: TopicPartition) -> PymqError:
        """Remove and return the error marker at the front of `tp`'s queue (from `blocked`)."""
        queue = self._queues[tp]
        err, _ = queue.popleft()
        assert isinstance(err, PymqError)
        if not queue:
            del self._queues[tp]
        return err
