"""OffsetFetcher: ListOffsets, and turning committed offsets and reset strategies into positions
(Kafka's OffsetFetcher with the committed-offset refresh of ConsumerCoordinator).

`list_offsets` (one request per leader) serves the consumer, the admin client and the range
reader. The `OffsetFetcher` class gives a consumer's partitions their positions:
  - `initialize_positions`: Kafka's refreshCommittedOffsetsIfNeeded then resetPositionsIfNeeded:
    the group's committed offset where there is one, else a reset per auto_offset_reset
    ("none": no position, and poll raises NoOffsetForPartitionError until a seek);
  - `reset_positions`: seek_to_beginning / seek_to_end, as reset requests resolved at once;
  - `reset_positions_if_needed`: resolve the pending reset requests with ListOffsets. An answer
    applies only if its partition still awaits that reset (`maybe_seek_unvalidated`): a seek, a
    revocation or another reset meanwhile wins.
Loop-local: call it on the loop that owns the `Cluster`.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import protocol
from client.cluster import Cluster
from client.subscription_state import SubscriptionState, reset_timestamp
from common.errors import PymqError
from common.topic_partition import TopicPartition
from protocol import READ_UNCOMMITTED, ListOffsetsPartition, ListOffsetsRequest, TopicRequest

log = logging.getLogger("pymq.consumer")

# The group's committed offsets of some partitions (None: nothing committed).
CommittedLookup = Callable[[list[TopicPartition]], Awaitable[dict[TopicPartition, int | None]]]


async def list_offsets(cluster: Cluster, timestamps: dict[TopicPartition, int],
                       isolation_level: int = READ_UNCOMMITTED) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets for many partitions, one request per leader; raises the first partition error.
    With read_committed, the latest offset is the last stable offset."""
    found, failed = await list_offsets_per_leader(cluster, timestamps, isolation_level)
    if failed:
        raise next(iter(failed.values()))
    return found


async def list_offsets_per_leader(cluster: Cluster, timestamps: dict[TopicPartition, int],
                                  isolation_level: int = READ_UNCOMMITTED
                                  ) -> tuple[dict[TopicPartition, tuple[int, int]], dict[TopicPartition, PymqError]]:
    """ListOffsets, one request per leader, each answered or failed on its own (Kafka's
    OffsetFetcher sends per node too): (offset, timestamp) of the partitions answered, and the
    error of each of the others (a leader down fails only its own partitions)."""
    by_node: dict[int, dict[str, list[ListOffsetsPartition]]] = {}
    failed: dict[TopicPartition, PymqError] = {}
    for (topic, partition), ts in timestamps.items():
        try:
            node = await cluster.leader(topic, partition)
        except PymqError as err:
            failed[(topic, partition)] = err
            continue
        by_node.setdefault(node, {}).setdefault(topic, []).append(ListOffsetsPartition(partition, ts))
    found: dict[TopicPartition, tuple[int, int]] = {}
    for node, topics in by_node.items():
        try:
            reply = await cluster.send(node, ListOffsetsRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items()),
                                                                isolation_level=isolation_level))
        except PymqError as err:
            failed.update({(t, p.partition): err for t, ps in topics.items() for p in ps})
            continue
        for t in reply.topics:
            for p in t.partitions:
                err = p.error()
                if err is not None:
                    failed[(t.name, p.partition)] = err
                else:
                    found[(t.name, p.partition)] = (p.offset, p.timestamp)
    return found, failed


async def reset_offsets(cluster: Cluster, tps: Iterable[TopicPartition], strategy: str,
                        isolation_level: int = READ_UNCOMMITTED) -> dict[TopicPartition, int]:
    """The offset each partition's reset `strategy` ("earliest", "latest") points at now."""
    target = reset_timestamp(strategy)
    found = await list_offsets(cluster, {tp: target for tp in tps}, isolation_level)
    return {tp: offset for tp, (offset, _) in found.items()}


class OffsetFetcher:
    """Positions for a consumer's partitions (see the module docstring). `committed` looks up
    the group's committed offsets (None: the consumer has no group)."""

    def __init__(self, cluster: Cluster, subscriptions: SubscriptionState, committed: CommittedLookup | None,
                 isolation_level: int = READ_UNCOMMITTED) -> None:
        self.cluster = cluster
        self.isolation_level = isolation_level
        self._subs = subscriptions
        self._committed = committed

    async def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        return await list_offsets(self.cluster, timestamps, self.isolation_level)

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, (offset, timestamp) of the first record at or after the time, or None."""
        found = await self.list_offsets(timestamps)
        return {tp: (off, ts) if off >= 0 else None for tp, (off, ts) in found.items()}

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in (await self.list_offsets({tp: protocol.EARLIEST_TIMESTAMP for tp in tps})).items()}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in (await self.list_offsets({tp: protocol.LATEST_TIMESTAMP for tp in tps})).items()}

    async def reset_positions(self, tps: list[TopicPartition], strategy: str) -> None:
        """seek_to_beginning / seek_to_end: request the reset of `tps` and resolve it now. A failed
        lookup withdraws the request (the positions stay) and raises."""
        self._subs.request_offset_reset(tps, strategy)
        try:
            await self.reset_positions_if_needed(tps)
        finally:
            self._withdraw_resets(tps, strategy)

    async def initialize_positions(self, tps: Iterable[TopicPartition]) -> None:
        """Start positions for assigned partitions without one: the group's committed offset,
        else a reset per auto_offset_reset. A position set meanwhile (a seek inside on_assign)
        wins. On a failure the partitions left without a position stay as they were (still
        initializing if they were)."""
        wanted = [tp for tp in tps if self._subs.is_assigned(tp) and not self._subs.has_valid_position(tp)]
        if not wanted:
            self._subs.initialization_done(tps)
            return
        for topic in sorted({t for t, _ in wanted}):
            await self.cluster.partitions(topic)  # the fetchers need the leaders
        committed = await self._committed(wanted) if self._committed is not None else {}
        for tp, offset in committed.items():
            if offset is not None:
                self._subs.seek_if_unpositioned(tp, offset)
        rest = [tp for tp in wanted if committed.get(tp) is None and self._subs.is_assigned(tp)
                and not self._subs.has_valid_position(tp)]
        self._subs.request_offset_reset(rest)
        try:
            await self.reset_positions_if_needed(rest)
        finally:
            self._withdraw_resets(rest, self._subs.auto_offset_reset)
            # Those positioned (committed offset, or their leader answered) are done even if
            # others failed: they are fetched while the rest waits for its leader.
            self._subs.initialization_done([tp for tp in tps if self._subs.has_valid_position(tp)])
        self._subs.initialization_done(tps)

    async def reset_positions_if_needed(self, only: Iterable[TopicPartition] | None = None) -> None:
        """Resolve the pending reset requests (of `only`, when given) with ListOffsets, one lookup
        per strategy; an answer applies only where that reset is still pending. Partitions whose
        leader answered get their positions even when another leader failed; then the first
        failure is raised, after a metadata refresh when it was retriable (a leader moved or went
        down: the next attempt asks the new one, as Kafka's requestUpdate makes it)."""
        pending = self._subs.partitions_needing_reset()
        if only is not None:
            wanted = set(only)
            pending = {tp: strategy for tp, strategy in pending.items() if tp in wanted}
        failures: dict[TopicPartition, PymqError] = {}
        for strategy in sorted(set(pending.values())):
            target = reset_timestamp(strategy)
            found, failed = await list_offsets_per_leader(self.cluster, {tp: target for tp, s in pending.items()
                                                                         if s == strategy})
            for tp, (offset, _) in found.items():
                self._subs.maybe_seek_unvalidated(tp, offset, strategy)
            failures.update(failed)
        if failures:
            fatal = [err for err in failures.values() if not err.retriable]
            if not fatal:
                await self._refresh_metadata(sorted({topic for topic, _ in failures}))
            raise (fatal or list(failures.values()))[0]

    async def _refresh_metadata(self, topics: list[str]) -> None:
        """Leaders of `topics` again; a failed refresh is left to the next attempt."""
        try:
            await self.cluster.refresh(topics)
        except PymqError as err:
            log.info("metadata refresh after a failed offset lookup failed: %s", err)

    def _withdraw_resets(self, tps: Iterable[TopicPartition], strategy: str) -> None:
        """Requests this call made and did not resolve (its lookup failed) end with it."""
        pending = self._subs.partitions_needing_reset()
        self._subs.cancel_offset_reset([tp for tp in tps if pending.get(tp) == strategy])
