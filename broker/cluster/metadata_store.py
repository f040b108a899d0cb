"""MetadataStore: the contract of the store holding cluster metadata (docs/architecture.md, Cluster metadata).

The contract is etcd's v3 key/value model, so that the etcd store maps onto it one to one:

- Keys are slash-separated paths (`topics/orders`, `partitions/orders/0`); values are JSON-able dicts.
- The store has one `revision` that grows by one with every committed change (a transaction
  that writes, a lease expiry that deletes keys). Each key records the revision that created it
  (`create_revision`), the one that last changed it (`mod_revision`) and its `version`: the number
  of writes since it was created (1 after the create, 0 = absent; a delete resets it).
- `txn(compares, on_success, on_failure)` is etcd's Txn: if every `Compare` holds, the `on_success`
  ops run, else the `on_failure` ops; all of it atomically, at one revision. A txn may not write
  one key twice (etcd refuses that too).
- `watch(prefix, start_revision)` yields every change under `prefix` in revision order, from
  `start_revision` if given (older revisions than the store keeps raise `CompactedRevisionError`:
  re-read with `txn([Get(prefix, prefix=True)])`, whose `TxnResult.revision` says where to resume).
- Leases: `grant_lease(ttl_s)` returns an id; a key put with `lease=id` is deleted (as one revision,
  seen by watchers as delete events) when the lease is revoked or not kept alive within its TTL.

`get/put/delete/list` are the single-key conveniences, built on `txn`. `VersionConflictError` is
what a failed single-key compare-and-set raises.

Implementations: `LocalMetadataStore` (embedded, one JSON file; the single-broker default) and an
etcd store for clusters; one conformance suite (tests/broker/cluster/test_metadata_store.py) holds
both to this contract. The interface is async because the etcd one is.
"""
from __future__ import annotations

import abc
import operator
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

from common.errors import InvalidRequestError, PymqError, VersionConflictError

__all__ = [
    "CompactedRevisionError", "Compare", "Delete", "Get", "LeaseNotFoundError",
    "MAX_TXN_OPS", "MetadataStore", "Op", "Put", "TxnResult", "VersionConflictError", "Versioned", "Watch",
    "WatchEvent", "validate_txn",
]

# Ops per transaction branch. Creating a topic of MAX_PARTITIONS (10,000) partitions is one txn of
# 10,001 puts; an etcd cluster serving pymq needs `--max-txn-ops` (default 128) and
# `--max-request-bytes` (default 1.5 MiB) raised to match.
MAX_TXN_OPS = 20_000
NO_LEASE = 0


class CompactedRevisionError(PymqError):
    """A watch asked for revisions the store no longer keeps (etcd: ErrCompacted). Not retriable
    as such: re-read the keys, then watch from the revision after that read."""

    def __init__(self, message: str, compacted_revision: int) -> None:
        super().__init__(message)
        self.compacted_revision = compacted_revision


class LeaseNotFoundError(PymqError):
    """The lease expired, was revoked or never existed (etcd: ErrLeaseNotFound); its keys are gone."""


@dataclass(frozen=True, slots=True)
class Versioned:
    """A key's value and its counters. `lease` is NO_LEASE (0) for a key no lease owns."""

    value: dict[str, Any]
    version: int
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = NO_LEASE


# -- transactions ------------------------------------------------------------------------------

CompareTarget = Literal["version", "create_revision", "mod_revision", "value"]
CompareOp = Literal["==", "!=", "<", ">"]
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a txn on one key's `target`. An absent key has version and revisions 0;
    a value comparison on an absent key never holds (as in etcd)."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: Any

    def __post_init__(self) -> None:
        if self.target not in ("version", "create_revision", "mod_revision", "value"):
            raise InvalidRequestError(f"unknown compare target {self.target!r}")
        if self.op not in _OPERATORS:
            raise InvalidRequestError(f"compare operator must be one of {sorted(_OPERATORS)}, got {self.op!r}")
        if self.target == "value" and self.op not in ("==", "!="):
            raise InvalidRequestError("values compare only with == or !=")

    @classmethod
    def version(cls, key: str, op: CompareOp, version: int) -> "Compare":
        return cls(key, "version", op, version)

    @classmethod
    def mod_revision(cls, key: str, op: CompareOp, revision: int) -> "Compare":
        return cls(key, "mod_revision", op, revision)

    @classmethod
    def create_revision(cls, key: str, op: CompareOp, revision: int) -> "Compare":
        return cls(key, "create_revision", op, revision)

    @classmethod
    def value(cls, key: str, op: CompareOp, value: dict[str, Any]) -> "Compare":
        return cls(key, "value", op, value)

    def holds(self, current: Versioned | None) -> bool:
        """Whether the condition holds for the key's `current` record (None = absent)."""
        if self.target == "value":
            return current is not None and _OPERATORS[self.op](current.value, self.operand)
        actual = 0 if current is None else getattr(current, self.target)
        return _OPERATORS[self.op](actual, self.operand)


@dataclass(frozen=True, slots=True)
class Get:
    """Read `key`, or every key starting with it when `prefix`. Responds with dict[str, Versioned]."""

    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Put:
    """Write `value` to `key`, owned by `lease` (NO_LEASE: none). Responds with the new Versioned."""

    key: str
    value: dict[str, Any]
    lease: int = NO_LEASE


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove `key`, or every key starting with it when `prefix`. Responds with the count removed (int)."""

    key: str
    prefix: bool = False


Op = Union[Get, Put, Delete]
Response = Union[dict[str, Versioned], Versioned, int]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Whether the compares held, one response per op of the branch that ran, and the store's
    revision after the txn (the revision a reader of these responses has seen)."""

    succeeded: bool
    responses: list[Response]
    revision: int


def validate_txn(compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op]) -> None:
    """Raise InvalidRequestError for a txn no store may run: too many ops, or one key written twice
    in a branch (a put twice, or a put inside a delete's range), which etcd refuses as well."""
    for branch in (on_success, on_failure):
        if len(branch) > MAX_TXN_OPS:
            raise InvalidRequestError(f"a transaction holds at most {MAX_TXN_OPS} ops per branch, got {len(branch)}")
        puts: set[str] = set()
        for op in branch:
            if isinstance(op, Put):
                if op.key in puts:
                    raise InvalidRequestError(f"transaction writes {op.key!r} twice")
                puts.add(op.key)
            elif not isinstance(op, (Get, Delete)):
                raise InvalidRequestError(f"not a transaction op: {op!r}")
        for op in branch:
            if isinstance(op, Delete) and any(_in_range(key, op.key, op.prefix) for key in puts):
                raise InvalidRequestError(f"transaction puts and deletes keys under {op.key!r}")
    if not all(isinstance(compare, Compare) for compare in compares):
        raise InvalidRequestError("compares must be Compare instances")


def _in_range(key: str, start: str, prefix: bool) -> bool:
    return key.startswith(start) if prefix else key == start


# -- watches -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change of one key. `revision` is the change's (shared by every event of one txn);
    a delete has value None and version 0."""

    type: Literal["put", "delete"]
    key: str
    value: dict[str, Any] | None
    version: int
    revision: int
    create_revision: int = 0
    lease: int = NO_LEASE


class Watch(abc.ABC):
    """An async iterator of WatchEvents in revision order, never skipping or reordering one.

    Iteration raises CompactedRevisionError when the events it needs are no longer kept (asked
    from too old a revision, or fell that far behind). `cancel()` ends the iteration: a pending
    `__anext__` returns StopAsyncIteration. Closing the store cancels its watches."""

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> WatchEvent: ...

    @abc.abstractmethod
    def cancel(self) -> None: ...


# -- the store ---------------------------------------------------------------------------------


class MetadataStore(abc.ABC):
    """The contract every store satisfies; see the module docstring for the model."""

    @abc.abstractmethod
    async def txn(self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()) -> TxnResult:
        """Run the txn atomically (validated by `validate_txn`). Raises LeaseNotFoundError, and writes
        nothing, if a put names a lease that does not exist."""

    @abc.abstractmethod
    async def revision(self) -> int:
        """The store's current revision (0 for a store that never changed)."""

    @abc.abstractmethod
    def watch(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Changes of keys under `prefix` from `start_revision` (inclusive; >= 1), or those
        committed after this call when None."""

    @abc.abstractmethod
    async def grant_lease(self, ttl_s: float) -> int:
        """A new lease (a nonzero id) that expires `ttl_s` seconds from now unless kept alive."""

    @abc.abstractmethod
    async def keep_alive(self, lease: int) -> float:
        """Restart the lease's TTL; returns the TTL in seconds. Raises LeaseNotFoundError."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> None:
        """Delete the lease's keys (one revision) and the lease. Raises LeaseNotFoundError."""

    async def close(self) -> None:
        return None

    # -- single-key conveniences on top of txn --

    async def get(self, key: str) -> Versioned | None:
        result = await self.txn([], [Get(key)])
        return result.responses[0].get(key)  # type: ignore[union-attr]

    async def list(self, prefix: str) -> dict[str, Versioned]:
        """Every key starting with `prefix`, with its value and counters."""
        result = await self.txn([], [Get(prefix, prefix=True)])
        return result.responses[0]  # type: ignore[return-value]

    async def put(self, key: str, value: dict[str, Any], expected_version: int | None = None, lease: int = NO_LEASE) -> int:
        """Write `value`; returns the new version. `expected_version=0` means "must not exist yet".
        Raises VersionConflictError on a failed compare-and-set."""
        compares = [] if expected_version is None else [Compare.version(key, "==", expected_version)]
        result = await self.txn(compares, [Put(key, value, lease)], [Get(key)])
        if not result.succeeded:
            raise _conflict(key, expected_version, result.responses[0])  # type: ignore[arg-type]
        return result.responses[0].version  # type: ignore[union-attr]

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Remove `key`; False if it did not exist. Raises VersionConflictError on a failed compare-and-set."""
        compares = [] if expected_version is None else [Compare.version(key, "==", expected_version)]
        result = await self.txn(compares, [Delete(key)], [Get(key)])
        if not result.succeeded:
            raise _conflict(key, expected_version, result.responses[0])  # type: ignore[arg-type]
        return result.responses[0] == 1


def _conflict(key: str, expected_version: int | None, found: dict[str, Versioned]) -> VersionConflictError:
    current = found.get(key)
    actual = f"found {current.version}" if current else "key is absent"
    return VersionConflictError(f"{key}: expected version {expected_version}, {actual}")

