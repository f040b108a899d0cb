"""Replica assignment: which brokers hold each partition of a new topic (Kafka's AdminUtils).

Leaders and replicas spread evenly: partition p's first (preferred leader) replica is broker
`(p + start) % n` of the list, and its followers are picked at a shift that grows every n
partitions, so that no two brokers follow each other for every partition (a broker's death
then spreads its followers' extra load over all others). With racks (`broker.rack`), the broker
list alternates racks and a partition's replicas take a broker of every rack before a second one
of any rack. `start` and the shift are random unless given, as Kafka's are, so topics created one
after another do not all lead on the same broker.

Pure functions: the controller and the topic registry call them with the live brokers.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from common.errors import InvalidReplicationFactorError


def assign_replicas(brokers: Mapping[int, str], partitions: int, replication_factor: int, *,
                    first_partition: int = 0, rng: random.Random | None = None) -> dict[int, tuple[int, ...]]:
    """partition -> replicas (preferred leader first) for partitions first_partition ..
    first_partition + partitions - 1. `brokers` maps broker id -> rack ("" for none); racks are
    used when every broker has one. InvalidReplicationFactorError when there are too few brokers."""
    if replication_factor < 1:
        raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {replication_factor}")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} needs that many live brokers; the cluster has {len(brokers)}")
    rng = rng or random.Random()
    racked = all(brokers.values()) and len(set(brokers.values())) > 1
    ordered = _rack_alternated(brokers) if racked else sorted(brokers)
    n = len(ordered)
    start, shift = rng.randrange(n), rng.randrange(n)
    shift += max(first_partition - 1, 0) // n  # the shifts partitions before the first ones took
    racks = {b: brokers[b] for b in ordered}
    rack_count = len(set(racks.values()))
    out: dict[int, tuple[int, ...]] = {}
    for i in range(partitions):
        current = first_partition + i
        if current > 0 and current % n == 0:
            shift += 1
        first = (current + start) % n
        replicas = [ordered[first]]
        if racked:
            _add_rack_aware(replicas, ordered, racks, rack_count, first, shift, replication_factor)
        else:
            replicas += [ordered[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)]
        out[current] = tuple(replicas)
    return out


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def _add_rack_aware(replicas: list[int], ordered: Sequence[int], racks: Mapping[int, str], rack_count: int,
                    first: int, shift: int, replication_factor: int) -> None:
    """Followers of a racked partition: a broker of a rack not yet used, until every rack is."""
    n, k = len(ordered), 0
    used_racks = {racks[replicas[0]]}
    while len(replicas) < replication_factor:
        broker = ordered[_replica_index(first, shift * rack_count, k, n)]
        k += 1
        if broker in replicas:
            continue
        if racks[broker] in used_racks and len(used_racks) < rack_count:
            continue
        replicas.append(broker)
        used_racks.add(racks[broker])


def _rack_alternated(brokers: Mapping[int, str]) -> list[int]:
    """Brokers ordered rack by rack in turn: a1, b1, c1, a2, b2, ... (racks and brokers sorted)."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(brokers.items()):
        by_rack.setdefault(rack, []).append(broker)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    return [column[i] for i in range(max(map(len, columns))) for column in columns if i < len(column)]
