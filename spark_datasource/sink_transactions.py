"""The `pymq` sinks' two-phase commit: each Spark task writes inside a transaction that it
prepares, and the driver commits (or aborts) all of them.

    task (executor)     producer with transactional id `{prefix}-{partitionId}`
                        prev = init_transactions()     fences every older instance of the id and
                                                        aborts its open or prepared transaction
                        prev == (label, committed)      an earlier run committed this partition's
                                                        rows of this batch: write nothing (skipped)
                        begin, send every row, prepare_transaction(label) -> PreparedWrite
    driver              commit(messages[, batchId]):    Admin.complete_transaction(p, commit=True)
                                                        for every prepared one (a failure fails the
                                                        query or job: nothing is dropped silently)
                        abort(messages[, batchId]):     complete_transaction(p, commit=False)

Streaming (`DataSourceStreamArrowWriter`): the label is `{queryId}:{batchId}` (Spark's local
properties `sql.streaming.queryId` and `streaming.sql.batchId`, which the Python worker's
TaskContext carries: the query id is kept in the checkpoint, so it is the same after a restart)
and the prefix is stable across restarts of one query: `transactionalIdPrefix`, or else derived
from the query's `checkpointLocation` (a hash of it). The query id in the label keeps a query
whose checkpoint was deleted and started again at the same location (batch ids from 0 again,
the same transactional ids) from taking the old query's committed batch N for its own.
Why a micro-batch is then written exactly once:
- Spark records a batch in the checkpoint's commit log only after the sink's `commit` returned,
  and a restarted query runs the last planned batch again with the same batch id and the same
  input offsets.
- A partition whose transaction for that batch committed before the driver died finds
  `(label, True)` as its id's last transaction and writes nothing.
- A partition whose transaction was prepared but not committed (or still open) is aborted by the
  new task's init_transactions (fencing), and written again; so is a task retried within a run.
This assumes a batch's partitions are deterministic for the same input offsets: partition i of
the replayed batch holds the rows partition i held before. That holds for the pymq source (its
ranges are planned from the offsets alone) and for stateful aggregations, whose shuffle partition
count and state are restored from the checkpoint. A partition with no rows opens no transaction:
by the same assumption it had none in any earlier run either.

Batch (`DataSourceArrowWriter`): the prefix is unique to the job (a uuid made on the driver when
the writer is created) and the label is that uuid; nothing is visible to read_committed readers
until the driver's `commit`, and a failed job's `abort` aborts every prepared transaction (a
retried task fences and aborts its failed attempt's, even one Spark never reported).
A versioned batch write (`txnAppId` and `txnVersion`, as Delta Lake's, for `foreachBatch`: the
micro-batch id as the version) has a prefix stable for the application (`transactionalIdPrefix`,
or a hash of the app id) and the label `{appId}:{version}`, so a micro-batch that Spark replays
after a crash calls the function again with the same version and the write skips the partitions
that committed it, exactly as the streaming sink does; this is how a query in Update mode, which
Spark refuses for Python data source sinks, writes exactly once.

Prepared transactions never time out (they wait for the driver): a query stopped for good between
prepare and commit holds its output partitions' last stable offset until it is restarted (or an
admin client completes them by hand: `Admin.describe_transactions` lists them, state "Prepared").
Transactions still open (not prepared) are aborted by the coordinator after
`transaction.timeout.ms` (the sink's default: 5 minutes).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from client import Producer
from client.admin import AsyncAdmin
from client.transactions import PreparedTransaction
from common.errors import PymqError
from spark_datasource.options import InvalidOptionError

log = logging.getLogger("pymq.spark.writer")

# Spark's local properties holding the micro-batch id of a streaming query's jobs
# (MicroBatchExecution.BATCH_ID_KEY) and the query's id (StreamExecution.QUERY_ID_KEY, kept in the
# checkpoint's metadata); Python workers receive the task's local properties.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# How long the driver keeps retrying a retriable failure to complete the prepared transactions.
COMPLETE_TIMEOUT_S = 120.0

# send(producer, batches) -> rows per topic, once every row is acknowledged (or raise).
SendRows = Callable[[Producer, Iterator[pa.RecordBatch]], dict[str, int]]


@dataclass
class PreparedWrite(WriterCommitMessage):
    """What one task wrote: acknowledged rows per topic and its prepared transaction (None when
    the task had no rows, or `skipped`: an earlier run committed this batch's rows of the
    partition)."""

    rows: dict[str, int]
    prepared: PreparedTransaction | None
    skipped: bool = False


@dataclass(frozen=True)
class WriteVersion:
    """A batch write's `txnAppId` and `txnVersion` (Delta Lake's options for idempotent writes
    from `foreachBatch`): the write of one version of one application is committed once."""

    app_id: str
    version: int

    @property
    def label(self) -> str:
        """The label of the write's transactions."""
        return f"{self.app_id}:{self.version}"


@dataclass(frozen=True)
class TransactionNaming:
    """How a sink's tasks name their transactions: `{prefix}-{partitionId}`, labelled with the
    query id and micro-batch id (streaming, `label` None) or the job's `label` (batch)."""

    prefix: str
    label: str | None = None

    @classmethod
    def for_stream(cls, prefix_option: str | None, checkpoint_location: str | None) -> "TransactionNaming":
        """Stable across restarts of one query, distinct between queries (their checkpoints are).
        The topic is left out of the hash on purpose: a query restarted with another `topic`
        option must still fence, and so abort, the transactions it left prepared."""
        if prefix_option:
            return cls(prefix_option)
        if not checkpoint_location:
            raise InvalidOptionError("the exactly-once pymq stream sink names its transactions after the query: give "
                                     "writeStream a 'checkpointLocation' option or the sink a 'transactionalIdPrefix'")
        digest = hashlib.sha256(checkpoint_location.rstrip("/").encode()).hexdigest()[:20]
        return cls(f"pymq-sink-{digest}")

    @classmethod
    def for_job(cls, prefix_option: str | None, application: WriteVersion | None = None) -> "TransactionNaming":
        """A batch job's naming: unique to the job (a uuid), or, for a versioned write
        (`txnAppId`/`txnVersion`), stable for the application so that writing a version again
        finds the partitions that committed it."""
        if application is None:
            job = uuid.uuid4().hex
            return cls(f"{prefix_option or 'pymq-batch'}-{job}", label=job)
        digest = hashlib.sha256(application.app_id.encode()).hexdigest()[:20]
        return cls(prefix_option or f"pymq-batch-{digest}", label=application.label)

    def task_id_and_label(self) -> tuple[str, str]:
        """The running task's transactional id and label (called on the executor)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise RuntimeError("pymq sink: a task's transaction is named from its TaskContext, and there is none")
        label = self.label
        if label is None:
            query, batch = context.getLocalProperty(QUERY_ID_PROPERTY), context.getLocalProperty(BATCH_ID_PROPERTY)
            if query is None or batch is None:
                raise RuntimeError(f"pymq stream sink: the task lacks Spark's {QUERY_ID_PROPERTY!r} or "
                                   f"{BATCH_ID_PROPERTY!r} local property, so its micro-batch is unknown and exactly "
                                   "once cannot be kept")
            label = f"{query}:{batch}"
        return f"{self.prefix}-{context.partitionId()}", label


def write_prepared(bootstrap: str, producer_settings: dict[str, Any], transactional_id: str, label: str,
                   batches: Iterator[pa.RecordBatch], send: SendRows) -> PreparedWrite:
    """Send every row of `batches` in a transaction of `transactional_id` and prepare it labelled
    `label`; skip the rows when the id's last transaction is `label`'s, committed."""
    batches = _non_empty(batches)
    first = next(batches, None)
    if first is None:
        return PreparedWrite({}, None)
    with Producer(bootstrap, **producer_settings, transactional_id=transactional_id) as producer:
        previous = producer.init_transactions()
        if previous == (label, True):
            log.info("pymq sink: %s committed %s in an earlier run: not written again", transactional_id, label)
            return PreparedWrite({}, None, skipped=True)
        producer.begin_transaction()
        try:
            written = send(producer, _chain(first, batches))
            prepared = producer.prepare_transaction(label=label)
        except BaseException:
            _abort_quietly(producer, transactional_id)
            raise
    return PreparedWrite(written, prepared)


def _abort_quietly(producer: Producer, transactional_id: str) -> None:
    """Abort the failing task's open transaction now: left open, it would hold its partitions'
    last stable offset (every read_committed reader) until `transaction.timeout.ms`. The task's
    own error is the one raised; an abort that fails too is only logged (the timeout, or a retried
    task's fencing, still ends the transaction)."""
    try:
        producer.abort_transaction()
    except PymqError as err:
        log.warning("pymq sink: aborting the failed task's transaction of %s: %s", transactional_id, err)


def _non_empty(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return (b for b in batches if b.num_rows)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def prepared_of(messages: Sequence[WriterCommitMessage | None]) -> list[PreparedTransaction]:
    return [m.prepared for m in messages if isinstance(m, PreparedWrite) and m.prepared is not None]


def complete_all(bootstrap: str, prepared: Sequence[PreparedTransaction], commit: bool,
                 timeout_s: float = COMPLETE_TIMEOUT_S) -> None:
    """Commit every prepared transaction (all at once), retrying retriable failures until
    `timeout_s`, and raise the first failure that remains: the query or job fails, and a batch
    whose transactions cannot all commit is never reported written. A retry of a decision already
    taken is answered OK by the coordinator. With `commit` False (Spark is failing the write
    anyway) each is aborted and a failure is logged, not raised: a transaction fenced since
    (PRODUCER_FENCED) was aborted by then already."""
    if prepared:
        asyncio.run(_complete_all(bootstrap, prepared, commit, timeout_s))


async def _complete_all(bootstrap: str, prepared: Sequence[PreparedTransaction], commit: bool,
                        timeout_s: float) -> None:
    admin = AsyncAdmin(bootstrap)
    try:
        outcomes = await asyncio.gather(*(_complete(admin, p, commit, time.monotonic() + timeout_s)
                                          for p in prepared), return_exceptions=True)
    finally:
        await admin.close()
    failures = [(p, o) for p, o in zip(prepared, outcomes) if isinstance(o, BaseException)]
    if commit and failures:
        p, first = failures[0]
        raise RuntimeError(f"pymq sink: {len(failures)} of {len(prepared)} prepared transactions could not be "
                           f"committed; first: {p.transactional_id}: {first!r}") from first
    for p, err in failures:
        log.warning("pymq sink: aborting %s: %r", p.transactional_id, err)


async def _complete(admin: AsyncAdmin, prepared: PreparedTransaction, commit: bool, deadline: float) -> None:
    while True:
        try:
            await admin.complete_transaction(prepared, commit=commit)
            return
        except PymqError as err:
            if not err.retriable or time.monotonic() >= deadline:
                raise
            log.warning("pymq sink: completing %s: %s; retrying", prepared.transactional_id, err)
        await asyncio.sleep(0.5)
