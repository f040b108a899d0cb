"""MetadataState: the key space at one revision, and what a transaction does to it.

A pure state machine (no I/O, no asyncio): `apply` turns (state, ops) into the next state, the
ops' responses and the watch events, leaving the old state untouched. `LocalMetadataStore`
persists the next state and only then makes it current, so a failed write changes nothing.
"""
from __future__ import annotations

import json
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from broker.cluster.metadata_store import (
    NO_LEASE,
    Compare,
    Delete,
    Get,
    LeaseNotFoundError,
    Op,
    Put,
    Response,
    Versioned,
    WatchEvent,
)


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of ops on a state: `state` is the same object when nothing changed."""

    state: "MetadataState"
    responses: list[Response]
    events: list[WatchEvent]


class MetadataState:
    """Keys with their records at `revision`. Never mutated after construction: values inside are
    shared with watch events and snapshots, so callers hand out copies."""

    __slots__ = ("keys", "revision")

    def __init__(self, keys: Mapping[str, Versioned], revision: int) -> None:
        assert revision >= 0, revision
        self.keys = keys
        self.revision = revision

    def read(self, key: str, prefix: bool) -> dict[str, Versioned]:
        return _read(self.keys, key, prefix)

    def holds(self, compares: Sequence[Compare]) -> bool:
        return all(compare.holds(self.keys.get(compare.key)) for compare in compares)

    def keys_of(self, lease: int) -> list[str]:
        assert lease != NO_LEASE
        return [key for key, record in self.keys.items() if record.lease == lease]

    def apply(self, ops: Sequence[Op], live_leases: Container[int]) -> Applied:
        """Run `ops` in order at revision + 1 (later ops see earlier ones' effects). Raises
        LeaseNotFoundError for a put under a lease not in `live_leases`; nothing is changed then."""
        revision = self.revision + 1
        keys: dict[str, Versioned] | None = None  # copied on the first write
        responses: list[Response] = []
        events: list[WatchEvent] = []
        for op in ops:
            current = self.keys if keys is None else keys
            if isinstance(op, Get):
                responses.append(_read(current, op.key, op.prefix))
                continue
            doomed = [] if isinstance(op, Put) else list(_read(current, op.key, op.prefix))
            if isinstance(op, Put):
                if op.lease != NO_LEASE and op.lease not in live_leases:
                    raise LeaseNotFoundError(f"lease {op.lease:x} not found: it expired or was revoked")
            if keys is None and (isinstance(op, Put) or doomed):
                keys = dict(self.keys)
            if isinstance(op, Put):
                record = _put(keys, op, revision)  # type: ignore[arg-type]
                responses.append(record)
                events.append(WatchEvent("put", op.key, record.value, record.version, revision,
                                         record.create_revision, record.lease))
            else:
                for key in doomed:
                    del keys[key]  # type: ignore[union-attr]
                    events.append(WatchEvent("delete", key, None, 0, revision))
                responses.append(len(doomed))
        if keys is None:
            return Applied(self, responses, events)
        assert events, "a changed key space has events"
        return Applied(MetadataState(keys, revision), responses, events)

    def to_json(self) -> dict[str, Any]:
        return {"format": 2, "revision": self.revision, "keys": {
            k: {"value": v.value, "version": v.version, "create_revision": v.create_revision,
                "mod_revision": v.mod_revision, "lease": v.lease}
            for k, v in self.keys.items()
        }}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "MetadataState":
        """Read `to_json`'s form, or the first format (a flat map of key -> value and version,
        without revisions), whose keys all count as written at revision 1."""
        if not isinstance(raw.get("format"), int):
            keys = {k: Versioned(v["value"], v["version"], 1, 1) for k, v in raw.items()}
            return cls(keys, 1 if keys else 0)
        keys = {k: Versioned(v["value"], v["version"], v["create_revision"], v["mod_revision"], v["lease"])
                for k, v in raw["keys"].items()}
        return cls(keys, raw["revision"])

    def without_leased_keys(self) -> tuple["MetadataState", list[str]]:
        """This state minus every key a lease owns, as one revision: what a store that keeps its
        leases in memory does on load, since the process that kept them alive is gone."""
        leased = [key for key, record in self.keys.items() if record.lease != NO_LEASE]
        if not leased:
            return self, []
        return self.apply([Delete(key) for key in leased], ()).state, leased


def _read(keys: Mapping[str, Versioned], key: str, prefix: bool) -> dict[str, Versioned]:
    if not prefix:
        found = keys.get(key)
        return {} if found is None else {key: found}
    return {k: v for k, v in keys.items() if k.startswith(key)}


def _put(keys: dict[str, Versioned], op: Put, revision: int) -> Versioned:
    """Store a private copy of the value (the caller may change theirs), counters advanced."""
    value = json.loads(json.dumps(op.value))
    previous = keys.get(op.key)
    if previous is None:
        record = Versioned(value, 1, revision, revision, op.lease)
    else:
        record = replace(previous, value=value, version=previous.version + 1, mod_revision=revision, lease=op.lease)
    keys[op.key] = record
    return record
