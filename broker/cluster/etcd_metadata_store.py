"""EtcdMetadataStore: the MetadataStore of a cluster, kept in etcd v3 (docs/cluster.md).

The contract (broker/cluster/metadata_store.py) is etcd's own model, so each call is one etcd RPC:
`txn` is a Txn, `watch` a Watch from a revision, leases are etcd leases. Keys live under a
namespace (`pymq/{cluster}/` by default) so clusters can share an etcd; values are canonical JSON
(sorted keys, no spaces), which makes etcd's byte comparison of values the contract's equality of
JSON values (except that 1 and 1.0 differ).

The async client is aetcd: its gRPC channel and stubs for the unary calls (built from etcd's
protobuf messages directly, since aetcd's helpers drop fields the contract needs, such as a put's
previous version), and its watcher, which multiplexes every watch over one stream.

Endpoints: one or more members of one etcd cluster, `host:port[,host:port...]`. Calls go to one
member at a time; one that refuses the connection or does not answer in time sends the next calls
to the next member (the client is replaced, and the old one closed once its calls in flight are
past their deadline). Watches and lease keep-alives follow. etcd's own Raft makes every member's
answers the cluster's, so any member will do.

Faults: every RPC has a deadline (`timeout_s`). etcd unreachable, or not answering in time, raises
MetadataStoreUnavailableError (retriable). A write that timed out may still have been applied, as
with any remote store: callers re-read before they retry a change that is not idempotent. A watch
whose stream breaks resumes by itself from the revision after the last event it delivered, so
it never skips an event while etcd keeps the history (CompactedRevisionError once it does not).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import aetcd
import aetcd.exceptions
from aetcd import rpc
from aetcd.utils import prefix_range_end

from broker.cluster.metadata_store import (
    CompactedRevisionError,
    Compare,
    Get,
    LeaseNotFoundError,
    MetadataStore,
    Op,
    Put,
    Response,
    TxnResult,
    Versioned,
    Watch,
    WatchEvent,
    validate_txn,
)
from common.errors import InvalidRequestError, MetadataStoreLimitError, MetadataStoreUnavailableError, PymqError

log = logging.getLogger("pymq.metadata.etcd")

DEFAULT_NAMESPACE = "pymq/default/"
DEFAULT_TIMEOUT_S = 5.0
WATCH_RETRY_S = (0.05, 1.0)  # first and longest pause between attempts to re-create a broken watch
# A list of every partition state of a large cluster is one response: allow big messages both ways.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_TARGETS = {"version": rpc.Compare.VERSION, "create_revision": rpc.Compare.CREATE,
            "mod_revision": rpc.Compare.MOD, "value": rpc.Compare.VALUE}
_RESULTS = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS, ">": rpc.Compare.GREATER}
_UNAVAILABLE = {rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED, rpc.StatusCode.CANCELLED}


def encode_value(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def parse_endpoints(endpoints: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` as (host, port) pairs; InvalidRequestError names a bad one."""
    parsed = []
    for endpoint in endpoints.split(","):
        host, _, port = endpoint.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequestError(f"etcd endpoints are host:port, comma-separated; got {endpoint!r} in {endpoints!r}")
        parsed.append((host, int(port)))
    return parsed


class EtcdMetadataStore(MetadataStore):
    """A MetadataStore on an etcd cluster reached at `endpoints` (`host:port[,host:port...]`).
    Open with `await EtcdMetadataStore.connect(...)`."""

    def __init__(self, endpoints: str, namespace: str = DEFAULT_NAMESPACE, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.namespace = namespace
        self._ns = namespace.encode()
        self.timeout_s = timeout_s
        self._current = 0  # the member calls go to
        self._client = self._new_client()
        self._closed = False
        self._retiring: dict[asyncio.Task[None], aetcd.Client] = {}  # clients of failed members, closing
        self._seen_revision = 0  # the newest revision any response showed (where watches from "now" start)
        self._watches: set[EtcdWatch] = set()

    @property
    def endpoint(self) -> str:
        """The member calls go to now, `host:port`."""
        host, port = self.endpoints[self._current]
        return f"{host}:{port}"

    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._current]
        return aetcd.Client(host, port, timeout=self.timeout_s, options={
            "grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
            "grpc.max_send_message_length": _MAX_MESSAGE_BYTES,
        })

    @classmethod
    async def connect(cls, endpoints: str, namespace: str = DEFAULT_NAMESPACE,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> "EtcdMetadataStore":
        """Open a store and read etcd's revision (MetadataStoreUnavailableError if etcd does not answer)."""
        store = cls(endpoints, namespace, timeout_s)
        try:
            await store.revision()
        except BaseException:
            await store.close()
            raise
        return store

    # -- key/value --

    async def txn(self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()) -> TxnResult:
        validate_txn(compares, on_success, on_failure)
        request = rpc.TxnRequest(compare=[self._compare(c) for c in compares],
                                 success=[self._request_op(op) for op in on_success],
                                 failure=[self._request_op(op) for op in on_failure])
        response = await self._call("Txn", "kvstub", request)
        revision = self._saw(response.header.revision)
        branch = on_success if response.succeeded else on_failure
        return TxnResult(response.succeeded, [self._response(op, r, revision) for op, r in zip(branch, response.responses)],
                         revision)

    async def revision(self) -> int:
        response = await self._call("Range", "kvstub", rpc.RangeRequest(key=self._ns, count_only=True))
        return self._saw(response.header.revision)

    def watch(self, prefix: str, start_revision: int | None = None) -> Watch:
        if start_revision is not None and (not isinstance(start_revision, int) or start_revision < 1):
            raise InvalidRequestError(f"a watch starts at revision 1 or later, got {start_revision!r}")
        watch = EtcdWatch(self, prefix, self._seen_revision + 1 if start_revision is None else start_revision)
        self._watches.add(watch)
        return watch

    # -- leases --

    async def grant_lease(self, ttl_s: float) -> int:
        if not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
            raise InvalidRequestError(f"a lease TTL is a positive number of seconds, got {ttl_s!r}")
        response = await self._call("LeaseGrant", "leasestub", rpc.LeaseGrantRequest(TTL=math.ceil(ttl_s)))
        return response.ID

    async def keep_alive(self, lease: int) -> float:
        client = await self._connected()
        try:
            async for reply in client.leasestub.LeaseKeepAlive([rpc.LeaseKeepAliveRequest(ID=lease)],
                                                               timeout=self.timeout_s):
                if reply.TTL <= 0:
                    raise LeaseNotFoundError(f"lease {lease:x} not found: it expired or was revoked")
                return float(reply.TTL)
        except rpc.AioRpcError as err:
            raise self._failed(client, err, "LeaseKeepAlive") from None
        raise MetadataStoreUnavailableError("etcd ended the lease keep-alive stream without an answer")

    async def revoke_lease(self, lease: int) -> None:
        await self._call("LeaseRevoke", "leasestub", rpc.LeaseRevokeRequest(ID=lease))

    async def close(self) -> None:
        self._closed = True
        for watch in list(self._watches):
            watch.cancel()
        for task, client in list(self._retiring.items()):
            task.cancel()
            await _quietly(client.close())
        await self._client.close()

    # -- etcd messages --

    def _key(self, key: str) -> bytes:
        return self._ns + key.encode()

    def _range(self, key: str, prefix: bool) -> dict[str, bytes]:
        start = self._key(key)
        return {"key": start, "range_end": prefix_range_end(start)} if prefix else {"key": start}

    def _compare(self, compare: Compare) -> rpc.Compare:
        message = rpc.Compare(key=self._key(compare.key), result=_RESULTS[compare.op], target=_TARGETS[compare.target])
        if compare.target == "value":
            message.value = encode_value(compare.operand)
        else:
            setattr(message, compare.target, compare.operand)
        return message

    def _request_op(self, op: Op) -> rpc.RequestOp:
        if isinstance(op, Get):
            return rpc.RequestOp(request_range=rpc.RangeRequest(**self._range(op.key, op.prefix)))
        if isinstance(op, Put):
            # The previous record tells the new one's version and create revision: etcd's
            # PutResponse carries nothing else.
            return rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(op.key), value=encode_value(op.value),
                                                            lease=op.lease, prev_kv=True))
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(**self._range(op.key, op.prefix)))

    def _response(self, op: Op, response: Any, revision: int) -> Response:
        if isinstance(op, Get):
            return {self._unkey(kv.key): _versioned(kv) for kv in response.response_range.kvs}
        if isinstance(op, Put):
            previous = response.response_put.prev_kv if response.response_put.HasField("prev_kv") else None
            return Versioned(json.loads(encode_value(op.value)), previous.version + 1 if previous else 1,
                             previous.create_revision if previous else revision, revision, op.lease)
        return response.response_delete_range.deleted

    def _unkey(self, key: bytes) -> str:
        return key[len(self._ns):].decode()

    def _event(self, event: Any) -> WatchEvent:
        kv = event.kv
        if event.kind == aetcd.rtypes.EventKind.DELETE:
            return WatchEvent("delete", self._unkey(kv.key), None, 0, kv.mod_revision)
        return WatchEvent("put", self._unkey(kv.key), json.loads(kv.value), kv.version, kv.mod_revision,
                          kv.create_revision, kv.lease)

    def _saw(self, revision: int) -> int:
        self._seen_revision = max(self._seen_revision, revision)
        return revision

    # -- calls --

    async def _connected(self) -> aetcd.Client:
        """The current member's client, connected."""
        client = self._client
        try:
            await client.connect()
        except (aetcd.exceptions.ClientError, asyncio.TimeoutError) as err:
            endpoint = self.endpoint
            self._fail_over(client)
            raise MetadataStoreUnavailableError(f"etcd at {endpoint} is unreachable: {err}") from None
        return client

    async def _call(self, method: str, stub: str, request: Any) -> Any:
        client = await self._connected()
        try:
            return await getattr(getattr(client, stub), method)(request, timeout=self.timeout_s)
        except rpc.AioRpcError as err:
            raise self._failed(client, err, method) from None

    def _failed(self, client: aetcd.Client, err: rpc.AioRpcError, method: str) -> PymqError:
        """`err` as a pymq error; a member that is down or does not answer is left for the next."""
        translated = _translate(err, method, self.endpoint)
        if err.code() in _UNAVAILABLE:
            self._fail_over(client)
        return translated

    def _fail_over(self, client: aetcd.Client) -> None:
        """The member behind `client` failed: the next calls go to the next endpoint (unless a
        concurrent failure moved on already). The old client closes once its calls in flight are
        past their deadline; the watches on it then resume on the new one."""
        if client is not self._client or len(self.endpoints) == 1 or self._closed:
            return
        failed = self.endpoint
        self._current = (self._current + 1) % len(self.endpoints)
        self._client = self._new_client()
        log.warning("etcd at %s failed; trying %s", failed, self.endpoint)

        async def close_later() -> None:
            await asyncio.sleep(self.timeout_s)
            await _quietly(client.close())
        task = asyncio.get_running_loop().create_task(close_later())
        self._retiring[task] = client  # referenced until done (the loop keeps only weak references)
        task.add_done_callback(lambda done: self._retiring.pop(done, None))


def _versioned(kv: Any) -> Versioned:
    return Versioned(json.loads(kv.value), kv.version, kv.create_revision, kv.mod_revision, kv.lease)


def _translate(err: rpc.AioRpcError, method: str, endpoint: str = "etcd") -> PymqError:
    """The named pymq error for an etcd RPC failure."""
    details = err.details() or ""
    if "lease not found" in details:
        return LeaseNotFoundError(f"lease not found: it expired or was revoked ({details})")
    if "too many operations" in details or "request is too large" in details or \
            err.code() == rpc.StatusCode.RESOURCE_EXHAUSTED:
        return MetadataStoreLimitError(f"etcd refused a {method} as too large ({details}); start etcd with "
                                       "the --max-txn-ops and --max-request-bytes that docs/cluster.md gives")
    if err.code() in _UNAVAILABLE:
        return MetadataStoreUnavailableError(f"etcd at {endpoint} did not answer {method}: {err.code().name} {details}")
    return MetadataStoreUnavailableError(f"etcd {method} failed: {err.code().name} {details}")


class EtcdWatch(Watch):
    """One etcd watch under the store's namespace. Started at once (so nothing committed after
    the `watch()` call is missed), re-created from the next revision if its stream breaks."""

    def __init__(self, store: EtcdMetadataStore, prefix: str, start_revision: int) -> None:
        self._store = store
        self._prefix = prefix
        self._next_revision = start_revision
        self._events: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        self._cancelled = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        """Feed the queue from etcd; on a broken stream, pause and re-create from the next revision."""
        pause = WATCH_RETRY_S[0]
        key = self._store._key(self._prefix)
        while not self._cancelled:
            handle = client = None
            try:
                client = await self._store._connected()
                handle = await client.watch(key, range_end=prefix_range_end(key), start_revision=self._next_revision)
                async for event in handle:
                    pause = WATCH_RETRY_S[0]
                    translated = self._store._event(event)
                    self._next_revision = translated.revision + 1
                    self._events.put_nowait(translated)
                if self._cancelled:
                    return
                if client is not self._store._client and not self._store._closed:
                    continue  # the store moved to another member and closed this client: resume there
                # The watcher shut down (the store closed): nothing more will come.
                self._events.put_nowait(None)
                return
            except aetcd.exceptions.RevisionCompactedError as err:
                self._events.put_nowait(CompactedRevisionError(
                    f"revision {self._next_revision} is compacted in etcd (kept from {err.compacted_revision}): "
                    "re-read the keys and watch from the revision after that read", err.compacted_revision))
                return
            except (aetcd.exceptions.ClientError, MetadataStoreUnavailableError, rpc.AioRpcError) as err:
                unreachable = (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError)
                if client is not None and (isinstance(err, unreachable) or
                                           isinstance(err, rpc.AioRpcError) and err.code() in _UNAVAILABLE):
                    self._store._fail_over(client)
                log.warning("etcd watch on %r broke (%s); resuming from revision %d in %.2f s",
                            self._prefix, err, self._next_revision, pause)
            finally:
                if handle is not None:
                    asyncio.get_running_loop().create_task(_quietly(handle.cancel()))
            await asyncio.sleep(pause)
            pause = min(pause * 2, WATCH_RETRY_S[1])

    async def __anext__(self) -> WatchEvent:
        item = None if self._cancelled else await self._events.get()
        if item is None or self._cancelled:
            self.cancel()
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.cancel()
            raise item
        return item

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._task.cancel()
        self._store._watches.discard(self)
        self._events.put_nowait(None)


async def _quietly(call: Any) -> None:
    try:
        await call
    except Exception:  # noqa: BLE001 - cancelling a watch on a broken or closed stream
        pass
