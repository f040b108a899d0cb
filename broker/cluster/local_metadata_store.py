"""LocalMetadataStore: the embedded MetadataStore of a single broker, one JSON file, no service.

The whole key space lives in memory (a `MetadataState`) and in one file. Each transaction that
changes something writes the complete new state to a temp file, fsyncs it, renames it over the
old file and fsyncs the directory: ONE durable write per transaction however many keys it
touches, run on a worker thread so the event loop keeps serving. A crash leaves either the old
or the new file, never a torn one; the new state becomes visible only after its write succeeded.

Leases live in memory, because the only process that could keep them alive is this one: on load,
keys a lease owned are deleted (as etcd would once their TTL ran out with their owner gone).
Lease deadlines run on an injectable `Clock`. The recent revisions' events are kept in a bounded
`WatchHistory` for watches; the history starts empty on load (older revisions count as compacted).
"""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import secrets
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from broker.cluster.clock import Clock, SystemClock, Timer
from broker.cluster.metadata_state import Applied, MetadataState
from broker.cluster.metadata_store import (
    Compare,
    Delete,
    Get,
    LeaseNotFoundError,
    MetadataStore,
    Op,
    Response,
    TxnResult,
    Versioned,
    Watch,
    validate_txn,
)
from broker.cluster.watch_history import LocalWatch, WatchHistory
from broker.executors import BoundedExecutor
from common.errors import InvalidRequestError

log = logging.getLogger("pymq.metadata")

HISTORY_MAX_EVENTS = 50_000  # events kept for watches resuming from a revision (5 topics of 10k partitions)
EXPIRY_RETRY_S = 1.0  # when deleting an expired lease's keys failed (disk), try again after this


@dataclass(slots=True)
class _Lease:
    ttl_s: float
    deadline: float  # clock.monotonic() seconds
    expired: bool = False  # past its deadline and being deleted: keep-alive can no longer save it


class LocalMetadataStore(MetadataStore):
    """The embedded store. Use from one event loop; transactions that write are serialized."""

    def __init__(self, path: str | Path, clock: Clock | None = None, history_max_events: int = HISTORY_MAX_EVENTS,
                 executor: BoundedExecutor | None = None) -> None:
        self.path = Path(path)
        # Writes run one at a time (the lock below): one thread, and callers wait for room past that.
        self._executor = executor or BoundedExecutor("metadata", 1, 10_000)
        self._clock = clock or SystemClock()
        self._lock = asyncio.Lock()  # serializes writers; readers see the last committed state
        loaded = MetadataState.from_json(json.loads(self.path.read_text())) if self.path.exists() else MetadataState({}, 0)
        self._state, orphans = loaded.without_leased_keys()
        if orphans:
            log.info("dropped %d keys owned by leases of a previous run, e.g. %s", len(orphans), orphans[0])
        self._history = WatchHistory(self._state.revision, history_max_events)
        self._watches: weakref.WeakSet[LocalWatch] = weakref.WeakSet()
        self._leases: dict[int, _Lease] = {}
        self._timer: Timer | None = None
        self._expiring: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- key/value --

    async def txn(self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()) -> TxnResult:
        validate_txn(compares, on_success, on_failure)
        state = self._state
        succeeded = state.holds(compares)
        branch = on_success if succeeded else on_failure
        if all(isinstance(op, Get) for op in branch):
            # Nothing to write: answer from the committed state without queueing behind writers.
            return TxnResult(succeeded, [_copy(state.read(op.key, op.prefix)) for op in branch], state.revision)  # type: ignore[union-attr]
        async with self._lock:
            # Applying, writing and copying the responses all happen on a worker thread: a txn of
            # 10,000 puts costs tens of milliseconds of Python, which the event loop must not wait for.
            succeeded, applied, responses = await self._executor.run(self._apply_and_persist, compares, on_success, on_failure)
            self._publish(applied)
            return TxnResult(succeeded, responses, applied.state.revision)

    def _apply_and_persist(self, compares: Sequence[Compare], on_success: Sequence[Op],
                           on_failure: Sequence[Op]) -> tuple[bool, Applied, list[Response]]:
        """Worker-thread half of a writing txn (the loop holds the lock, so the state cannot move)."""
        succeeded = self._state.holds(compares)
        applied = self._state.apply(on_success if succeeded else on_failure, self._leases)
        if applied.state is not self._state:
            self._persist(applied.state)
        return succeeded, applied, [_copy(response) for response in applied.responses]

    async def revision(self) -> int:
        return self._state.revision

    def watch(self, prefix: str, start_revision: int | None = None) -> Watch:
        if start_revision is not None and (not isinstance(start_revision, int) or start_revision < 1):
            raise InvalidRequestError(f"a watch starts at revision 1 or later, got {start_revision!r}")
        start = self._state.revision + 1 if start_revision is None else start_revision
        watch = LocalWatch(self._history, prefix, start, self._watches.discard)
        if self._closed:
            watch.cancel()
        else:
            self._watches.add(watch)
        return watch

    # -- leases --

    async def grant_lease(self, ttl_s: float) -> int:
        if not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
            raise InvalidRequestError(f"a lease TTL is a positive number of seconds, got {ttl_s!r}")
        lease = 0
        while lease == 0 or lease in self._leases:
            lease = secrets.randbits(63)  # ids of a previous run are never reused knowingly
        self._leases[lease] = _Lease(float(ttl_s), self._clock.monotonic() + ttl_s)
        self._arm_expiry()
        return lease

    async def keep_alive(self, lease: int) -> float:
        found = self._live_lease(lease)
        found.deadline = self._clock.monotonic() + found.ttl_s
        return found.ttl_s

    async def revoke_lease(self, lease: int) -> None:
        async with self._lock:
            self._live_lease(lease)
            await self._delete_keys_of(lease)

    def _live_lease(self, lease: int) -> _Lease:
        """The lease if it exists and its deadline has not passed (its expiry may still be pending)."""
        found = self._leases.get(lease)
        if found is None or found.expired or found.deadline <= self._clock.monotonic():
            raise LeaseNotFoundError(f"lease {lease:x} not found: it expired or was revoked")
        return found

    async def _delete_keys_of(self, lease: int) -> None:
        """Delete the lease's keys as one revision, then forget it (caller holds the lock)."""
        applied = self._state.apply([Delete(key) for key in self._state.keys_of(lease)], ())
        await self._commit(applied)
        del self._leases[lease]

    def _arm_expiry(self) -> None:
        """Set the one timer at the earliest lease deadline (a kept-alive lease just finds nothing due)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._leases and not self._closed:
            deadline = min(lease.deadline for lease in self._leases.values())
            self._timer = self._clock.call_later(deadline - self._clock.monotonic(), self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self._expire_due())
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _expire_due(self) -> None:
        async with self._lock:
            if self._closed:
                return
            now = self._clock.monotonic()
            for lease in [lease for lease, found in self._leases.items() if found.deadline <= now]:
                self._leases[lease].expired = True
                try:
                    await self._delete_keys_of(lease)
                except OSError:
                    log.exception("could not delete the keys of expired lease %x; retrying", lease)
                    self._leases[lease].deadline = now + EXPIRY_RETRY_S
            self._arm_expiry()

    # -- commit and persistence --

    async def _commit(self, applied: Applied) -> None:
        """Make `applied` durable, then current and visible to watches (caller holds the lock)."""
        if applied.state is not self._state:
            await self._executor.run(self._persist, applied.state)
            self._publish(applied)

    def _publish(self, applied: Applied) -> None:
        """Make a durable `applied` the current state and show its events to the watches."""
        assert self._lock.locked()
        if applied.state is self._state:
            return
        self._state = applied.state
        self._history.append(applied.state.revision, applied.events)
        for watch in list(self._watches):
            watch.notify()

    def _persist(self, state: MetadataState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(state.to_json(), f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def close(self) -> None:
        """End every watch and lease timer; an in-flight write finishes first. Leases die with the
        store (their keys stay in the file and are dropped by the next load)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for watch in list(self._watches):
            watch.cancel()
        async with self._lock:
            self._leases.clear()
        for task in list(self._expiring):
            task.cancel()
        await asyncio.gather(*self._expiring, return_exceptions=True)


def _copy(response: Response) -> Response:
    """Callers get their own values: changing them must not change the store."""
    if isinstance(response, Versioned):
        return replace(response, value=copy.deepcopy(response.value))
    if isinstance(response, dict):
        return {key: replace(found, value=copy.deepcopy(found.value)) for key, found in response.items()}
    return response
