"""`groupIdForLag`: a streaming query's position committed to a consumer group, so that
`pymq group describe GROUP` (or `Admin.group_lag`) shows how far a Spark pipeline is behind.
The Spark Kafka source cannot do this (SPARK-27549).

The checkpoint stays the source of truth for the query's position: the group's offsets are
written, never read back, and lag reporting never fails or stalls the query. A commit that fails
(the group has active members, the coordinator is unreachable, ...) is logged as a WARNING once
per kind of failure, and the next attempt comes after `RETRY_AFTER_FAILURE_S`; a commit waits
at most `COMMIT_TIMEOUT_S`.

What is committed: for every partition the query reads, the next offset it will read (the end
of the last finished micro-batch; before the first one, where the query starts), from outside
the group (generation -1), which the coordinator accepts only while the group has no members.
Each offset carries a metadata string naming the reader run and the batch end (bounded to
`METADATA_MAX_BYTES`). Spark does not tell a Python source its query id, so the run id is one
drawn when the query (re)starts, like Spark's runId.

When: Spark tells a source that micro-batch N finished (`commit(end)`) only when it plans batch
N+1, so the last batch before an idle spell, or of a Trigger.AvailableNow run, would never be
reported. `latestOffset(start)` comes at the same moment, and also when no batch follows, with
`start` the end of the last finished batch; the stream reader reports both, and unchanged
offsets are not committed again (except every `RECOMMIT_IDLE_S`, so that the group of an idle
query does not expire under offsets.retention.minutes).
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable

from client import AsyncAdmin
from client.loop_thread import LoopThread
from common.errors import NonEmptyGroupError
from common.topic_partition import TopicPartition

PartitionOffsets = dict[TopicPartition, int]

COMMIT_TIMEOUT_S = 3.0  # longest a micro-batch waits for its lag commit
RETRY_AFTER_FAILURE_S = 30.0  # an idle query asks every few ms: a failing group is not asked each time
RECOMMIT_IDLE_S = 3600.0  # unchanged offsets are committed again this often (offset expiry)
METADATA_MAX_BYTES = 512  # the broker's offset.metadata.max.bytes defaults to 4096

log = logging.getLogger("pymq.spark.lag")


def commit_metadata(run_id: str, offsets: PartitionOffsets, max_bytes: int = METADATA_MAX_BYTES) -> str:
    """`pymq-spark run=<run id> end=topic-0:12,topic-1:7,...`, cut to `max_bytes` (ending in
    '...' when cut): who committed, and the whole batch end as far as it fits."""
    ends = ",".join(f"{topic}-{partition}:{offset}" for (topic, partition), offset in sorted(offsets.items()))
    text = f"pymq-spark run={run_id} end={ends}"
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes - 3].decode(errors="ignore") + "..."


class LagGroup:
    """Commits one streaming query's positions to consumer group `group_id`.

    Driver only, called from the stream reader's thread; owns one admin client on its own I/O
    thread, opened at the first commit and released by `close()`. `commit` never raises."""

    def __init__(self, group_id: str, bootstrap_servers: str, *, timeout_s: float = COMMIT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.group_id = group_id
        self.run_id = uuid.uuid4().hex
        self._bootstrap = bootstrap_servers
        self._timeout_s = timeout_s
        self._clock = clock
        self._thread: LoopThread | None = None
        self._admin: AsyncAdmin | None = None
        self._committed: PartitionOffsets | None = None
        self._recommit_at = -math.inf  # unchanged offsets are committed again from then on
        self._retry_at = -math.inf  # after a failure, no commit before then
        self._warned: set[str] = set()  # failure kinds already logged as a WARNING

    def commit(self, offsets: PartitionOffsets) -> bool:
        """Commit `offsets` (the next offset to read, per partition) to the group; True when
        committed now. Skipped (False) when they are the offsets last committed, or within
        RETRY_AFTER_FAILURE_S of a failed commit. A failure is logged and returns False."""
        now = self._clock()
        if not offsets or now < self._retry_at:
            return False
        if offsets == self._committed and now < self._recommit_at:
            return False
        try:
            thread, admin = self._client()
            metadata = commit_metadata(self.run_id, offsets)
            thread.run(admin.alter_group_offsets(self.group_id, offsets, metadata), self._timeout_s)
        except Exception as err:  # noqa: BLE001 - lag reporting must never fail the query
            self._retry_at = now + RETRY_AFTER_FAILURE_S
            self._failed(err)
            return False
        self._committed, self._recommit_at = dict(offsets), now + RECOMMIT_IDLE_S
        return True

    def close(self) -> None:
        """Release the admin client; calling it again does nothing."""
        thread, admin = self._thread, self._admin
        self._thread = self._admin = None
        if thread is None or admin is None:
            return
        try:
            thread.run(admin.close(), self._timeout_s)
        except Exception as err:  # noqa: BLE001 - closing must not hide why the query stopped
            log.debug("closing the admin client of lag group %r: %r", self.group_id, err)
        finally:
            thread.stop()

    def _client(self) -> tuple[LoopThread, AsyncAdmin]:
        if self._thread is None or self._admin is None:
            # Its own request timeout too, so that the admin's coordinator retries end in time.
            timeout_ms = max(int(self._timeout_s * 1000), 1)
            self._thread = LoopThread("pymq-lag-group")
            self._admin = AsyncAdmin(self._bootstrap, request_timeout_ms=timeout_ms)
        return self._thread, self._admin

    def _failed(self, err: Exception) -> None:
        kind = type(err).__name__
        if isinstance(err, NonEmptyGroupError):
            why = ("it has active members, and a group's offsets can be set from outside only while it is empty: "
                   "give the query a group of its own that no consumer joins")
        elif isinstance(err, TimeoutError):
            why = f"no answer within {self._timeout_s:g}s"
        else:
            why = f"{kind}: {err}"
        if kind in self._warned:
            log.debug("lag group %r: commit failed again (%s)", self.group_id, why)
            return
        self._warned.add(kind)
        log.warning("could not commit the query's position to group %r (option groupIdForLag) for lag reporting: "
                    "%s. The query goes on (its checkpoint holds its position); the next attempt is in %gs, and "
                    "further %s failures are logged at DEBUG level.",
                    self.group_id, why, RETRY_AFTER_FAILURE_S, kind)
