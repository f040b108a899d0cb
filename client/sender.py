"""Sender: drains ready batches from the accumulator into Produce requests, per leader, with
retries and in-flight limits (Kafka's Sender).

Callbacks on the producer's loop, not a task: a run drains what is ready, writes Produce requests
straight to the leaders' connections and returns; each reply's callback completes its batches and
runs the sender again if anything waits. No coroutine, task or timeout wrapper per request: on the
latency path (a handful of records per request) those were most of the producer's CPU. Slow paths
(connecting, unknown leaders, retry back-off, metadata refresh, a broker that does not answer)
are tasks in `_tasks`.

A broker that let a Produce request time out (hung, e.g. SIGSTOPped, or cut off) gets no more
Produce requests until it answers a probe: batches routed to it wait (`_unanswered`), and those
whose partition metadata moves to another leader go there at once. The cluster moves a hung
leader's partitions only once its session times out, so resending to it after the back-off would
wait out a second request timeout; Cluster.await_answer_or_move has the details.

Loop-local, except `wake` (any thread) and reads of `busy` and `next_wake`, which appending
threads do to decide whether a new batch needs a wake-up.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from client.accumulator import RecordAccumulator
from client.client_metrics import ProducerMetrics
from client.cluster import Cluster
from client.connection import BrokerConnection, raise_for_error
from client.idempotence import ProducerSequences, SequenceWindows
from client.transactions import TransactionManager
from client.producer_batch import ProducerBatch
from client.retry import Retry
from common.errors import (
    DeliveryTimeoutError,
    NetworkError,
    OutOfOrderSequenceError,
    PymqError,
    RequestTimedOutError,
    UnknownProducerIdError,
)
from common.topic_partition import TopicPartition
from protocol import InitProducerIdRequest, ProducePartition, ProduceRequest, ProduceResponse, TopicRequest

log = logging.getLogger("pymq.producer")

# What the leader answers an idempotent producer's batch it did not write because of its sequence.
SEQUENCE_REFUSED = (OutOfOrderSequenceError, UnknownProducerIdError)


class Sender:
    """Sends the accumulator's batches (see the module docstring). `refresh_metadata` reloads the
    cluster's metadata for the producer (its partition counts follow); the sender calls it before
    retries and every `metadata_max_age_s`."""

    def __init__(self, cluster: Cluster, accumulator: RecordAccumulator, refresh_metadata: Callable[[], Awaitable[None]],
                 *, acks: int, compression: str, max_in_flight: int, retries: int, retry_backoff_s: float,
                 retry_backoff_max_s: float, delivery_timeout_s: float, max_request_size: int,
                 request_timeout_ms: int, metadata_max_age_s: float,
                 sequences: ProducerSequences | None = None) -> None:
        self.cluster = cluster
        self.accumulator = accumulator
        self._refresh = refresh_metadata
        self.acks = acks
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.delivery_timeout_s = delivery_timeout_s
        self.max_request_size = max_request_size
        self.request_timeout_ms = request_timeout_ms  # how long the broker may wait for the acks
        self.metadata_max_age_s = metadata_max_age_s
        self.sequences = sequences  # an idempotent producer's (client/idempotence.py), else None
        self.windows: SequenceWindows = accumulator.mutes  # type: ignore[assignment]  # with sequences only
        self.transactions: TransactionManager | None = None  # a transactional producer's (client/transactions.py)
        self._adding = False  # an AddPartitionsToTxn is under way
        self._metadata_refreshed = 0.0
        self._in_flight: dict[int, int] = {}  # Produce requests outstanding per broker
        self._replies: set[asyncio.Future[Any]] = set()  # their reply futures
        self.busy: dict[TopicPartition, int] = {}  # partitions with a request in flight: how many
        # Batches drained for a broker whose connection is being opened, oldest first: one list
        # and one connect task per broker, so they go out in the order they were drained.
        self._awaiting_connection: dict[int, list[ProducerBatch]] = {}
        # Likewise batches whose partition is missing from the cached metadata: one lookup at a time.
        self._awaiting_leaders: list[ProducerBatch] | None = None
        # Brokers that let a request time out: the batches routed to each since, oldest first,
        # held until it answers a probe or their partition moves (_await_answer_or_move).
        self._unanswered: dict[int, list[ProducerBatch]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # slow paths: connect, resolve, retry, refresh
        self._queued = False  # a `run` call is queued on the loop
        self._timer: asyncio.TimerHandle | None = None  # runs the sender when a batch lingers out
        self.next_wake = 0.0  # monotonic time `_timer` fires (inf: none needed; 0: unknown)
        self._refreshing = False
        self.closed = False
        self.flush_requested = False  # the next run sends every open batch, lingering or not
        self._loop: asyncio.AbstractEventLoop | None = None
        self.metrics = ProducerMetrics()  # the producer's own (Producer.metrics())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def refresh_metadata(self) -> None:
        """Reload metadata now and note when, for the periodic refresh."""
        await self._refresh()
        self._metadata_refreshed = time.monotonic()

    def wake(self) -> None:
        """Have the sender run soon, from any thread; at most one run is queued at a time."""
        loop = self._loop
        if loop is None or self._queued or self.closed:
            return
        self._queued = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is loop:
                loop.call_soon(self.run)
            else:
                loop.call_soon_threadsafe(self.run)
        except RuntimeError:  # the loop closed under a late append
            self._queued = False

    async def close(self) -> None:
        """Stop: no more runs; slow paths and requests in flight are cancelled (their batches
        are failed by the producer)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for reply in list(self._replies):
            reply.cancel()


    def run(self) -> None:
        self._queued = False
        if self.closed:
            return
        force, self.flush_requested = self.flush_requested, False
        batches, next_due = self.accumulator.drain(force, self.busy)
        if batches:
            self._dispatch(batches)
        self._arm_timer(next_due)
        sequences = self.sequences
        if sequences is not None:
            if sequences.ready_to_reset:
                sequences.resetting = True
                self._spawn(self._new_producer_id())
            elif sequences.to_add and not self._adding and self.transactions is not None:
                self._adding = True
                self._spawn(self._add_partitions(self.transactions))

    def _arm_timer(self, next_due: float | None) -> None:
        """Run the sender when the next open batch lingers out; `_next_wake` tells appending
        threads whether a new batch needs a wake-up at all (see _on_batch)."""
        if next_due is None:
            self.next_wake = math.inf
            return
        when = time.monotonic() + next_due
        if self._timer is not None and not self._timer.cancelled() and self.next_wake <= when:
            return  # an earlier run is armed; it re-arms for the rest
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._timer = self._loop.call_later(next_due, self._on_timer)
        self.next_wake = when

    def _on_timer(self) -> None:
        self._timer = None
        self.next_wake = 0.0
        self.run()

    def _spawn(self, coro: Any) -> None:
        """Run a slow path as a task that close() cancels."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, batches: list[ProducerBatch]) -> None:
        """Group batches per leader (from cached metadata) and send them. While a lookup of
        leaders is under way, batches of the topics it looks up wait behind its batches."""
        now = time.monotonic()
        if now - self._metadata_refreshed > self.metadata_max_age_s and not self._refreshing:
            self._refreshing = True
            self._spawn(self._refresh_in_background())
        by_node: dict[int, list[ProducerBatch]] = {}
        unknown: list[ProducerBatch] = []
        waiting = self._awaiting_leaders
        looked_up = {b.topic for b in waiting} if waiting is not None else ()
        for batch in batches:
            if now - batch.created > self.delivery_timeout_s:
                self._fail(batch, DeliveryTimeoutError(f"{batch.record_count} records to {batch.topic}-{batch.partition} "
                                                       f"not acknowledged within {self.delivery_timeout_s}s"))
                continue
            parts = self.cluster.topics.get(batch.topic)
            if parts is None or batch.partition >= len(parts) or batch.topic in looked_up:
                unknown.append(batch)
            else:
                by_node.setdefault(parts[batch.partition].leader, []).append(batch)
        if unknown and waiting is not None:
            waiting.extend(unknown)
        elif unknown:
            self._awaiting_leaders = unknown
            self._spawn(self._resolve_leaders())
        for node, node_batches in by_node.items():
            held = self._unanswered.get(node)
            if held is None:
                self._send_to(node, node_batches)
            else:
                held += node_batches
                self._mark_busy(node_batches)

    def _send_to(self, node: int, batches: list[ProducerBatch]) -> None:
        """Requests of at most max_request_size to `node`, while it has fewer than max_in_flight
        outstanding; the rest wait at the front of the queue for a reply to free a slot.

        While the connection is being opened, batches join those already waiting for it, even
        once it is open: the waiting ones are older and must go first (see _connect)."""
        waiting = self._awaiting_connection.get(node)
        if waiting is not None:
            waiting.extend(batches)
            return
        conn = self.cluster.open_connection(node)
        if conn is None:
            self._awaiting_connection[node] = list(batches)
            self._spawn(self._connect(node))
            return
        requests: list[list[ProducerBatch]] = [[]]
        size = 0
        for batch in batches:
            encoded = batch.encode(self.compression)
            if requests[-1] and size + encoded.size > self.max_request_size:
                requests.append([])
                size = 0
            requests[-1].append(batch)
            size += encoded.size
        for i, request in enumerate(requests):
            if self._in_flight.get(node, 0) >= self.max_in_flight:
                self.accumulator.requeue([b for r in requests[i:] for b in r])
                return
            self._launch(node, conn, request)

    def _launch(self, node: int, conn: BrokerConnection, batches: list[ProducerBatch]) -> None:
        """One Produce request. A partition's batches travel as one record set in queue order; the
        broker answers with the first offset, and each batch's base follows from the counts."""
        groups: dict[str, dict[int, list[ProducerBatch]]] = {}
        now = time.monotonic()
        for batch in batches:
            groups.setdefault(batch.topic, {}).setdefault(batch.partition, []).append(batch)
            batch.attempts += 1
            if self.sequences is not None:
                self.sequences.sent(batch)
            if batch.attempts == 1:
                self.metrics.batch_sent(batch.encode(self.compression).size, batch.record_count, now - batch.created)
        request = ProduceRequest(tuple(
            TopicRequest(topic, tuple(ProducePartition(p, tuple(part for b in group for part in b.encode(self.compression)))
                                      for p, group in parts.items()))
            for topic, parts in groups.items()), self.acks, self.request_timeout_ms)
        ordered = [b for parts in groups.values() for group in parts.values() for b in group]
        try:
            if self.acks == 0:
                conn.write(request, expect_response=False)
            else:
                reply = conn.request(request, self.cluster.request_timeout_s)
        except PymqError as err:  # the connection closed since it was looked up
            self._retry(ordered, err)
            return
        if self.acks == 0:
            self.metrics.request_done(0.0)  # no response to wait for
            for batch in ordered:
                self._succeed(batch, -1, -1)
            return
        partitions = [(topic, p) for topic, parts in groups.items() for p in parts]
        busy = self.busy
        for tp in partitions:
            busy[tp] = busy.get(tp, 0) + 1
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        self._replies.add(reply)
        reply.add_done_callback(partial(self._on_reply, node, conn, groups, partitions, now))

    def _on_reply(self, node: int, conn: BrokerConnection, groups: dict[str, dict[int, list[ProducerBatch]]],
                  partitions: list[TopicPartition], sent: float, reply: asyncio.Future[Any]) -> None:
        self._replies.discard(reply)
        self.metrics.request_done(time.monotonic() - sent)
        self._in_flight[node] -= 1
        busy = self.busy
        for tp in partitions:
            if busy[tp] == 1:
                del busy[tp]
            else:
                busy[tp] -= 1
        if reply.cancelled():  # close(): the batches fail there
            return
        try:
            response = ProduceResponse.from_control(*_checked_reply(reply))
        except (NetworkError, RequestTimedOutError) as err:
            if conn.unanswered(err):
                if isinstance(err, RequestTimedOutError):
                    self.metrics.requests_timed_out += 1
                    log.info("broker %d let a Produce request time out: its batches wait until it answers or "
                             "their partitions move", node)
                if node not in self._unanswered and not self.closed:
                    self._unanswered[node] = []
                    self._spawn(self._await_answer_or_move(node))
            self._retry([b for parts in groups.values() for group in parts.values() for b in group], err)
        except PymqError as err:
            for parts in groups.values():
                for group in parts.values():
                    for batch in group:
                        self._fail(batch, err)
        else:
            self._complete(groups, response)
        if self.accumulator.sealed or self.accumulator.open:
            self.wake()  # batches held back while this request was out may go now

    def _complete(self, groups: dict[str, dict[int, list[ProducerBatch]]], response: ProduceResponse) -> None:
        outcomes = {(t.name, p.partition): p for t in response.topics for p in t.partitions}
        retry: list[ProducerBatch] = []
        retry_error: PymqError | None = None
        for topic, parts in groups.items():
            for partition, group in parts.items():
                outcome = outcomes.get((topic, partition))
                err = NetworkError("broker response omitted the partition") if outcome is None else outcome.error()
                if err is None:
                    assert outcome is not None
                    if outcome.batch_offsets is not None and len(outcome.batch_offsets) == len(group):
                        for batch, base in zip(group, outcome.batch_offsets):
                            self._succeed(batch, base, outcome.log_append_time)
                        continue
                    base = outcome.base_offset
                    for batch in group:
                        self._succeed(batch, base, outcome.log_append_time)
                        base += batch.record_count
                elif isinstance(err, SEQUENCE_REFUSED) and self.sequences is not None:
                    self._sequence_refused(group, err)
                elif err.retriable:
                    retry.extend(group)
                    retry_error = err
                else:
                    for batch in group:
                        self._fail(batch, err)
        if retry:
            assert retry_error is not None
            self._retry(retry, retry_error)

    def _sequence_refused(self, group: list[ProducerBatch], err: PymqError) -> None:
        """The leader wrote nothing of `group` because of its sequence (client/idempotence.py)."""
        sequences = self.sequences
        assert sequences is not None
        if self.windows.earlier_unacknowledged(group[0]):
            self._retry(group, err, retriable=True)  # behind an older batch that goes again: so does it
        elif sequences.transactional:
            for batch in group:  # the transaction must abort (its epoch then starts sequences over)
                self._fail(batch, err)
        else:
            # Nothing before it is pending: the leader lost the producer's state (a failover under
            # acks=1, expiry). New sequences under a new producer id.
            log.info("%s-%d refused the producer's sequence (%s): a new producer id, and the %d batches go again",
                     group[0].topic, group[0].partition, err.name(), len(group))
            for batch in group:
                sequences.refused(batch)
            self.accumulator.requeue(group)

    def _retry(self, batches: list[ProducerBatch], err: PymqError, retriable: bool | None = None) -> None:
        """Fail what is out of time or retries, or not retriable; the rest go again after a
        back-off and a metadata refresh. Their partitions count as busy meanwhile, so their open
        batches keep filling instead of lingering out. Newer sealed batches of theirs may go
        first unless max_in_flight=1 (their partitions stay muted: PartitionMutes)."""
        now = time.monotonic()
        retryable = []
        retriable = err.retriable if retriable is None else retriable
        if retriable and not self._refreshing:
            # The leader may have moved (NOT_LEADER, a dead broker): the batches that will not
            # retry must not leave the next ones going to the same place (Kafka requests a
            # metadata update on such errors whether or not it retries).
            self._refreshing = True
            self._spawn(self._refresh_in_background())
        for batch in batches:
            if now - batch.created >= self.delivery_timeout_s:
                self._fail_delivery_timeout(batch, err)
            elif retriable and batch.attempts <= self.retries:
                retryable.append(batch)
                self.metrics.records_retried += batch.record_count
            else:
                self._fail(batch, err)
        if retryable:
            self._spawn(self._retry_after_backoff(retryable, err))

    async def _retry_after_backoff(self, batches: list[ProducerBatch], err: PymqError) -> None:
        self._mark_busy(batches)
        try:
            attempts = max(b.attempts for b in batches)
            backoff = min(self.retry_backoff_s * 2 ** max(attempts - 1, 0), self.retry_backoff_max_s)
            log.info("retrying %d batches after %s (attempt %d, backoff %.3fs)", len(batches), err.name(), attempts, backoff)
            await asyncio.sleep(backoff)
            try:
                await self.refresh_metadata()
            except PymqError as refresh_err:
                log.info("metadata refresh failed: %s", refresh_err)
        finally:
            self._unmark_busy(batches)
            self.accumulator.requeue(batches)
            self.wake()

    async def _await_answer_or_move(self, node: int) -> None:
        """`node` let a request time out: batches routed to it meanwhile wait in
        `_unanswered[node]` (their partitions busy, as during a retry's back-off) until it
        answers a probe, when they all go to it again, while those whose partition another
        leader takes go there at each metadata refresh (every retry back-off, 0.1 s at least)."""
        answered = False
        try:
            answered = await self.cluster.await_answer_or_move(
                node, self.refresh_metadata, partial(self._release_moved, node), max(self.retry_backoff_s, 0.1))
        finally:  # also when close() cancels it: the producer fails what is queued
            held = self._unanswered.pop(node)
            if answered:
                log.info("broker %d answers again: %d batches held for it go to it", node, len(held))
            self._unmark_busy(held)
            self.accumulator.requeue(held)
            self.wake()

    def _release_moved(self, node: int) -> bool:
        """After a metadata refresh: of the batches held for `node`, queue those whose partition
        has another leader (or none known: they are looked up) at the front, fail those past the
        delivery timeout, keep the rest. True when none is left and `node` leads no partition:
        not merely none held now, as the batches of the request that timed out may still be
        backing off, to be routed to it afterwards."""
        held = self._unanswered[node]
        now = time.monotonic()
        keep, moved = [], []
        for batch in held:
            if now - batch.created >= self.delivery_timeout_s:
                self._unmark_busy([batch])
                self._fail_delivery_timeout(batch, RequestTimedOutError(f"broker {node} does not answer"))
                continue
            parts = self.cluster.topics.get(batch.topic)
            led_by_node = parts is not None and batch.partition < len(parts) and parts[batch.partition].leader == node
            (keep if led_by_node else moved).append(batch)
        held[:] = keep
        if moved:
            log.info("%d batches held for broker %d, which does not answer, go to their partitions' new leaders",
                     len(moved), node)
            self._unmark_busy(moved)
            self.accumulator.requeue(moved)
            self.wake()
        return not keep and not any(p.leader == node for parts in self.cluster.topics.values() for p in parts)

    def _mark_busy(self, batches: list[ProducerBatch]) -> None:
        """Count the batches' partitions busy while they wait out of the accumulator (a retry's
        back-off, a broker that does not answer): their open batches keep filling meanwhile."""
        busy = self.busy
        for batch in batches:
            tp = (batch.topic, batch.partition)
            busy[tp] = busy.get(tp, 0) + 1

    def _unmark_busy(self, batches: list[ProducerBatch]) -> None:
        busy = self.busy
        for batch in batches:
            tp = (batch.topic, batch.partition)
            if busy[tp] == 1:
                del busy[tp]
            else:
                busy[tp] -= 1

    async def _resolve_leaders(self) -> None:
        """Batches whose partition is not in the cached metadata: look it up, then queue them
        all again in drain order (or retry/fail them with the lookup's error). Batches that join
        while it runs are looked up too; see _connect for why there is one list."""
        batches = self._awaiting_leaders
        assert batches is not None
        error: PymqError | None = None
        try:
            checked = 0
            while checked < len(batches):  # the list grows while a lookup is awaited
                await self.cluster.leader(batches[checked].topic, batches[checked].partition)
                checked += 1
        except PymqError as err:
            error = err
        finally:
            self._awaiting_leaders = None
        if error is not None:
            self._retry(batches, error)
            return
        self.accumulator.requeue(batches)
        self.wake()

    async def _connect(self, node: int) -> None:
        """Open the connection to `node`, then queue every batch that waited for it, in drain
        order, at the front (they are older than anything queued since).

        A task per sender run, each requeueing its own batches at the front when the connection
        opened, put the last run's batches first: a partition's records were written in reverse
        groups. Hence one list per broker, taken whole."""
        error: PymqError | None = None
        try:
            await self.cluster.connection(node)
        except PymqError as err:
            error = err
        finally:  # also when close() cancels the task: a later connect starts afresh
            batches = self._awaiting_connection.pop(node)
        if error is not None:
            for batch in batches:
                batch.attempts += 1  # a failed connection attempt counts as one
            self._retry(batches, error)
            return
        self.accumulator.requeue(batches)
        self.wake()

    async def _refresh_in_background(self) -> None:
        try:
            await self.refresh_metadata()
        except PymqError as err:
            log.info("periodic metadata refresh failed: %s", err)
        finally:
            self._refreshing = False

    async def _new_producer_id(self) -> None:
        """An idempotent producer's next producer id (the first, or one to start its sequences
        again: client/idempotence.py); the batches paused for it go then. Retried until it comes;
        paused batches past the delivery timeout fail meanwhile."""
        sequences = self.sequences
        assert sequences is not None
        retry = Retry(self.retry_backoff_s)
        try:
            while True:
                try:
                    response = await self.cluster.send(None, InitProducerIdRequest(
                        producer_id=sequences.producer_id, producer_epoch=sequences.epoch))
                    err = response.error()
                    if err is not None:
                        raise err
                    break
                except PymqError as err:
                    log.info("no producer id yet (%s): the batches wait", err)
                    self._fail_paused(err)
                    await retry.back_off(err)
            if sequences.producer_id >= 0:
                log.info("producer id %d replaces %d: sequences start again", response.producer_id, sequences.producer_id)
            held = self.windows.forget()
            self.accumulator.queue_first(sequences.install(response.producer_id, response.producer_epoch, held))
        finally:
            sequences.resetting = False
            self.wake()

    async def _add_partitions(self, transactions: TransactionManager) -> None:
        """The partitions a transaction's batches wait for join it; then those batches go."""
        sequences = self.sequences
        assert sequences is not None
        try:
            await transactions.add_pending_partitions(lambda: self.accumulator.queue_first(sequences.release_added()))
        finally:
            self._adding = False
            self.wake()

    def fail_all_paused(self, err: PymqError) -> None:
        """Fail every batch waiting outside the queue (a transaction aborted, or its partitions
        refused). No partition is wanted in the transaction any more: an AddPartitionsToTxn
        spawned but not yet begun must not add one after the abort (it would open a transaction
        at the coordinator that this producer does not know of)."""
        if self.sequences is not None:
            self.sequences.to_add.clear()
            for batch in self.sequences.take_paused():
                self._fail(batch, err)

    def _fail_paused(self, err: PymqError) -> None:
        """Fail the batches waiting for a producer id whose delivery timeout passed, or all of
        them if `err` says the id will not come."""
        sequences = self.sequences
        assert sequences is not None
        now = time.monotonic()
        keep = []
        for batch in sequences.paused:
            if not err.retriable:
                self._fail(batch, err)
            elif now - batch.created >= self.delivery_timeout_s:
                self._fail_delivery_timeout(batch, err)
            else:
                keep.append(batch)
        sequences.paused = keep

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        if self.sequences is not None:
            self.sequences.acknowledged(batch)
        batch.result.complete(base_offset, log_append_time)
        self.metrics.records_sent += batch.record_count
        if self.accumulator.done(batch):
            self.wake()

    def _fail_delivery_timeout(self, batch: ProducerBatch, err: PymqError) -> None:
        timeout = DeliveryTimeoutError(f"{batch.record_count} records to {batch.topic}-{batch.partition} not "
                                       f"acknowledged within {self.delivery_timeout_s}s (last error: {err.name()})")
        timeout.__cause__ = err
        self._fail(batch, timeout)

    def _fail(self, batch: ProducerBatch, err: BaseException) -> None:
        if self.sequences is not None:
            self.sequences.failed(batch, err if isinstance(err, PymqError) else PymqError(str(err)))
        batch.result.complete(-1, error=err)
        self.metrics.records_failed += batch.record_count
        if self.accumulator.done(batch):
            self.wake()


def _checked_reply(reply: asyncio.Future[Any]) -> tuple[dict[str, Any], memoryview]:
    """A reply future's (control, payload); its exception, or the PymqError its top-level error
    code names, is raised."""
    control, payload = reply.result()
    raise_for_error(control)
    return control, payload

