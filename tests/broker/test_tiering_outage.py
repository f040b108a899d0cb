"""The object store goes away under a tiering broker (issue 10's promise): produce keeps working on
local disk, tiering fails and retries with growing backoff, nothing local is deleted before it is
uploaded, and once the store is back tiering catches up and local retention trims the disk.

Real parts only: a broker process tiering to an S3 bucket on moto's server through s3fs. Between
them, a loopback TCP proxy run by this test (`StoreProxy`): moto keeps its objects in memory, so it
must keep running; the outage is the proxy's. "Down": the proxy stops listening and resets every
open connection (the broker's connects are refused). "Hung": it accepts connections and forwards
nothing (the broker's requests wait) until it is restored, when it resets them. "Resetting": it
accepts, notes the request head (botocore's attempt number) and resets it, which shows when tiering
tries again, so the backoff between failed runs is measured, not only announced. The test itself
reads the store straight from moto (`RemoteSegmentStore` on moto's endpoint), bypassing the proxy;
once the store is back, remote plus local and a consumer from offset 0 (the broker reads below the
local log start from the remote tier) must each give every record produced once, in order.

The broker runs under tests/broker/debug_tiering_broker.py so that every failed tiering run is in
its output ("failed (N in a row; retry in D ms)"), not only the first of a run."""
from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from client import Admin, Consumer, Producer
from tests.helpers.tiering import (
    TOPIC,
    check_complete,
    consume_from,
    create_topic,
    local_bases,
    manifest_of,
    value,
)
from tests.waiting import wait_until
from tests.tiered_storage.backends import REGION, MotoServer, free_port, make_bucket, s3_options
from tiered_storage import RemoteSegmentStore
from segment_format.manifest import PartitionManifest

REPO = Path(__file__).resolve().parents[2]
PREFIX = "pymq-tier"
BATCH = 200  # records of 100 bytes: one batch a little over a 16 KiB segment, so each seals one
FAILURE = re.compile(r"^(\S+ \S+) \S+ broker\.remote_log\.remote_log_manager: tiering UnifiedLog\(" + TOPIC
                     + r"-0, [^)]*\) failed \((\d+) in a row; retry in (\d+) ms\): (.*)$")
ATTEMPT = re.compile(rb"\r\namz-sdk-request: *attempt=(\d+)", re.IGNORECASE)


class StoreProxy:
    """A TCP proxy on 127.0.0.1:`port` to `upstream_port`, in threads of this process. `down()`:
    stop listening and reset every open connection; `hang()`: reset them, then accept new ones
    and forward nothing; `reset_all()`: reset them, then reset each new one once accepted;
    `up()`: listen and forward again on the same port (held connections are reset first)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.mode = "down"
        self.held_total = 0  # connections accepted while hung
        # Each request reset in reset_all mode: (accepted at, time.time(); botocore's attempt number
        # from its amz-sdk-request header, 1 for the first try of a request; request line).
        self.reset_requests: list[tuple[float, int | None, str]] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()  # both ends of forwarded connections
        self._held: set[socket.socket] = set()  # connections accepted while hung
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stop_accepting = threading.Event()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        with self._lock:  # connections accepted from now on are forwarded
            self.mode = "forward"
            held, self._held = self._held, set()
        for sock in held:
            self._reset(sock)
        if self._listener is None:
            self._listen()

    def hang(self) -> None:
        with self._lock:  # connections accepted from now on are held
            self.mode = "hang"
        self._reset_connections()
        if self._listener is None:
            self._listen()

    def reset_all(self) -> None:
        """Listen, and reset every connection once its request head arrived (noting it)."""
        with self._lock:
            self.mode = "reset"
        self._reset_connections()
        if self._listener is None:
            self._listen()

    def down(self) -> None:
        with self._lock:
            self.mode = "down"
        if self._listener is not None:
            self._stop_accepting.set()
            assert self._acceptor is not None
            self._acceptor.join(10)
            assert not self._acceptor.is_alive()
            self._listener.close()
            self._listener, self._acceptor = None, None
        self._reset_connections()
        with self._lock:
            held, self._held = self._held, set()
        for sock in held:
            self._reset(sock)

    close = down

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(0.05)
        self._listener = listener
        self._stop_accepting = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, args=(listener, self._stop_accepting),
                                          name="store-proxy-accept", daemon=True)
        self._acceptor.start()

    def _accept(self, listener: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                mode = self.mode
                if mode == "hang":
                    self._held.add(client)
                    self.held_total += 1
                elif mode == "reset":
                    self._held.add(client)
                else:
                    self._sockets.add(client)
            if mode == "forward":
                threading.Thread(target=self._connect, args=(client,), name="store-proxy-conn", daemon=True).start()
            elif mode == "reset":
                threading.Thread(target=self._note_and_reset, args=(client, time.time()), name="store-proxy-reset",
                                 daemon=True).start()
            elif mode != "hang":
                self._reset(client)

    def _note_and_reset(self, client: socket.socket, accepted: float) -> None:
        """Read the request's head, note it, reset the connection."""
        head = b""
        client.settimeout(2)
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 1 << 16:
                chunk = client.recv(1 << 16)
                if not chunk:
                    break
                head += chunk
        attempt = ATTEMPT.search(head)
        with self._lock:
            self.reset_requests.append((accepted, int(attempt[1]) if attempt else None,
                                        head.split(b"\r\n", 1)[0].decode("latin-1")))
        self._reset(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
            self._reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if client not in self._sockets:  # reset meanwhile
                upstream.close()
                return
            self._sockets.add(upstream)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), name="store-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            self._reset(src)
            self._reset(dst)

    def _reset(self, sock: socket.socket) -> None:
        """Close with an RST (SO_LINGER 0), as a store that went away would leave it."""
        with self._lock:
            self._sockets.discard(sock)
            self._held.discard(sock)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def _reset_connections(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._reset(sock)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[StoreProxy]:
    store_proxy = StoreProxy(moto.port)
    store_proxy.up()
    try:
        yield store_proxy
    finally:
        store_proxy.close()


class Scenario:
    """A broker tiering through `proxy` to a fresh bucket, a producer on it, and a store reading
    the bucket on moto directly."""

    def __init__(self, broker_factory, moto: MotoServer, proxy: StoreProxy) -> None:  # type: ignore[no-untyped-def]
        bucket = make_bucket(moto.endpoint_url)
        self.store = RemoteSegmentStore.from_url(f"s3://{bucket}/{PREFIX}", s3_options(moto.endpoint_url))
        self.broker = broker_factory(**{
            "remote.log.storage.system.enable": True, "remote.storage.url": f"s3://{bucket}/{PREFIX}",
            "remote.storage.s3.endpoint.url": proxy.endpoint_url, "remote.storage.s3.access.key": "testing",
            "remote.storage.s3.secret.key": "testing", "remote.storage.s3.region": REGION,
            "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50,
            "file.delete.delay.ms": 0, "log.flush.scheduler.interval.ms": 20})
        self.broker.module, self.broker.cwd = "tests.broker.debug_tiering_broker", REPO
        self.broker.start()
        create_topic(self.broker.bootstrap, 16 << 10, 32 << 10)
        self.producer = Producer(self.broker.bootstrap, linger_ms=5)
        self.produced = 0

    @property
    def log_dir(self) -> Path:
        return self.broker.log_dir

    def produce_batch(self) -> None:
        """One batch of BATCH records, acknowledged within a generous 20 s (the store plays no part)."""
        ids = range(self.produced, self.produced + BATCH)
        results = self.producer.send_batch(TOPIC, pa.table(
            {"key": [None] * len(ids), "value": [value(i) for i in ids]},
            schema=pa.schema([("key", pa.binary()), ("value", pa.binary())])))
        self.producer.flush(timeout_s=20)
        assert [r.error for r in results] == [None], results
        assert results[0].base_offset == self.produced
        self.produced += BATCH

    def manifest(self) -> PartitionManifest:
        return manifest_of(self.store)

    def tiered_and_trimmed(self) -> bool:
        """The manifest holds every sealed segment and local retention left at most 3 segments."""
        bases = local_bases(self.log_dir)
        return self.manifest().log_end_offset == bases[-1] and len(bases) <= 3

    def failures(self) -> list[tuple[datetime, int, int, str]]:
        """(time, failures in a row, announced retry delay ms, error) of each failed tiering run of
        the topic's partition in the broker's output."""
        out = []
        for line in self.broker.output.read_text(errors="replace").splitlines():
            match = FAILURE.match(line)
            if match:
                out.append((datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f"), int(match[2]), int(match[3]), match[4]))
        return out

    def tiering(self):  # type: ignore[no-untyped-def]
        """The partition's row of `pymq tier status` (Admin.describe_tiering)."""
        with Admin(self.broker.bootstrap) as admin:
            return admin.describe_tiering([TOPIC])

    def close(self) -> None:
        self.producer.close(timeout_s=10)


@pytest.fixture
def scenario(broker_factory, moto: MotoServer, proxy: StoreProxy) -> Iterator[Scenario]:  # type: ignore[no-untyped-def]
    made = Scenario(broker_factory, moto, proxy)
    try:
        yield made
    finally:
        made.close()


class LocalWatch:
    """Samples the partition's local segment files every few ms in a thread while the store is
    away. `remote_end` is the end offset of the last manifest committed before the outage: no
    local segment at or above it may be deleted (only the store could hold another copy), so
    every such segment seen once must stay, and the local log must keep starting at or below it."""

    def __init__(self, log_dir: Path, remote_end: int) -> None:
        self.log_dir, self.remote_end = log_dir, remote_end
        self.seen: set[int] = set()
        self.samples = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="local-watch", daemon=True)

    def __enter__(self) -> LocalWatch:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._sample()

    def _sample(self) -> None:
        bases = set(local_bases(self.log_dir))
        self.samples += 1
        if not bases or min(bases) > self.remote_end:
            self.violations.append(f"local log starts at {min(bases, default=None)}, above the remote end "
                                   f"{self.remote_end}: offsets only in local files were deleted")
        gone = self.seen - bases
        if gone:
            self.violations.append(f"local segments {sorted(gone)} deleted, not in the remote store "
                                   f"(which ends at {self.remote_end})")
        self.seen |= {base for base in bases if base >= self.remote_end}


def tier_some(scenario: Scenario, batches: int) -> PartitionManifest:
    """Produce `batches` batches and wait until every sealed segment is tiered, local retention
    deleted some uploaded ones, and the broker holds the answer to its last commit (the manifest
    version it reports is the store's): no request to the store is left in flight, so an outage
    from here on cannot be half-seen by a commit moto had whole."""
    for _ in range(batches):
        scenario.produce_batch()
    wait_until(lambda: scenario.tiered_and_trimmed() and local_bases(scenario.log_dir)[0] > 0, 30,
               "the first segments are tiered and gone from the local disk")
    wait_until(lambda: scenario.tiering()[0].manifest_version == scenario.manifest().version, 30,
               "the broker has the answer to its last manifest commit")
    manifest = scenario.manifest()
    assert len(manifest.segments) >= batches - 2
    return manifest


def recover(scenario: Scenario, down_manifest: PartitionManifest) -> None:
    """The store is back: tiering catches up with every sealed segment and local retention trims
    the local log; then every record produced is there once, in order, remote plus local."""
    def caught_up_and_nothing_local_lost() -> bool:  # a local segment goes only once a committed manifest names it
        bases = local_bases(scenario.log_dir)
        assert bases[0] <= scenario.manifest().log_end_offset
        return scenario.tiered_and_trimmed()

    wait_until(caught_up_and_nothing_local_lost, 45, "tiering caught up and local retention trimmed the disk")
    manifest = scenario.manifest()
    assert manifest.version > down_manifest.version
    assert manifest.log_end_offset > down_manifest.log_end_offset
    assert [s.base_offset for s in manifest.segments[:len(down_manifest.segments)]] == \
        [s.base_offset for s in down_manifest.segments]  # nothing uploaded before the outage changed
    check_complete(scenario.broker.bootstrap, scenario.log_dir, scenario.store, scenario.produced)
    # The broker serves the part below the local log start from the remote tier: one consumer
    # from offset 0 reads every record once, in order.
    assert local_bases(scenario.log_dir)[0] > 0
    with Consumer(scenario.broker.bootstrap, auto_offset_reset="none") as consumer:
        assert consumer.beginning_offsets([(TOPIC, 0)]) == {(TOPIC, 0): 0}
    assert consume_from(scenario.broker.bootstrap, 0, scenario.produced) == [value(i) for i in range(scenario.produced)]
    (row,) = scenario.tiering()
    assert (row.failures, row.last_error) == (0, None), row


@pytest.mark.slow
def test_store_down_produce_continues_tiering_backs_off_and_catches_up(scenario, proxy):
    """Connections to the store refused for as long as three failed tiering runs take: every
    batch produced meanwhile is acknowledged, the manifest stays at its pre-outage version, no
    local segment the manifest does not name is deleted, and the failed runs announce a retry
    delay that doubles. Back up: tiering uploads everything sealed, local retention trims the
    disk, and remote plus local hold each record produced once, in order."""
    tier_some(scenario, 8)
    proxy.down()
    down_manifest = scenario.manifest()  # straight from moto: the last commit before the outage

    def failed_three_runs_in_a_row() -> bool:
        assert scenario.manifest().version == down_manifest.version, "a manifest committed with the store down"
        return any(count >= 3 for _, count, _, _ in scenario.failures())

    with LocalWatch(scenario.log_dir, down_manifest.log_end_offset) as watch:
        sealed_before = len(local_bases(scenario.log_dir))
        # Several segments seal while the store is down, and tiering fails at least three runs in a row.
        for _ in range(8):
            scenario.produce_batch()
            assert scenario.manifest().version == down_manifest.version, "a manifest committed with the store down"
        wait_until(failed_three_runs_in_a_row, 60, "tiering fails three runs in a row", 0.25)
        scenario.produce_batch()  # still acknowledged after three failed runs
        # What must not happen cannot be waited for: local retention (every 50 ms) has ten chances
        # to delete a segment the store does not hold, while the watch samples every 5 ms.
        time.sleep(0.5)
        piled_up = len(local_bases(scenario.log_dir))
    assert watch.samples > 20
    assert not watch.violations, f"{len(watch.violations)} violations, the first: {watch.violations[:3]}"
    assert piled_up >= sealed_before + 7  # the segments sealed while the store was down are all still local
    assert scenario.manifest().version == down_manifest.version

    failures = scenario.failures()
    assert [count for _, count, _, _ in failures] == list(range(1, len(failures) + 1)), failures
    assert [delay for _, _, delay, _ in failures] == [500 << (n - 1) for n in range(1, len(failures) + 1)], failures
    assert "EndpointConnectionError" in failures[-1][3], failures  # refused, as the proxy is not listening
    (row,) = scenario.tiering()  # what `pymq tier status` shows meanwhile
    assert row.failures >= 3 and "EndpointConnectionError" in (row.last_error or ""), row
    assert row.manifest_version == down_manifest.version and row.remote_log_end_offset == down_manifest.log_end_offset, row
    assert row.upload_lag_offsets >= scenario.produced - down_manifest.log_end_offset - BATCH, row

    proxy.up()
    recover(scenario, down_manifest)


@pytest.mark.slow
def test_store_hung_produce_continues_and_tiering_catches_up(scenario, proxy):
    """The store accepts connections and answers nothing: tiering's requests wait, while produce
    is acknowledged as usual (the event loop does not wait on the store), nothing unnamed by the
    manifest is deleted locally, and the manifest does not move. Restored (the held connections
    reset), tiering catches up and every record is there once, in order."""
    tier_some(scenario, 6)
    proxy.hang()
    down_manifest = scenario.manifest()
    with LocalWatch(scenario.log_dir, down_manifest.log_end_offset) as watch:
        for _ in range(8):
            scenario.produce_batch()
        wait_until(lambda: proxy.held_total > 0, 20, "the broker asks the hung store")
        for _ in range(4):
            scenario.produce_batch()
            assert scenario.manifest().version == down_manifest.version, "a manifest committed with the store hung"
            # What must not happen cannot be waited for: produce goes on over 0.8 s of a hung
            # store while the watch checks that no local segment goes and the manifest stays put.
            time.sleep(0.2)
    assert watch.samples > 20
    assert not watch.violations, f"{len(watch.violations)} violations, the first: {watch.violations[:3]}"
    assert scenario.manifest().version == down_manifest.version
    proxy.up()
    recover(scenario, down_manifest)


@pytest.mark.slow
def test_store_resetting_connections_tiering_waits_its_backoff(scenario, proxy):
    """The store resets every connection (the proxy listens, so it sees when tiering tries): after
    each failed run, tiering does not touch the store again before the delay it announced (500 ms,
    then 1000 ms: a run every 50 ms task interval would show here), and the manifest does not
    move. Back up, it catches up."""
    tier_some(scenario, 4)
    proxy.reset_all()
    down_manifest = scenario.manifest()

    def first_tries_after(at: datetime) -> list[float]:
        """When requests tiering started afresh (botocore's first attempt) after a failure logged at `at`."""
        with proxy._lock:
            return [t for t, attempt, _ in proxy.reset_requests if attempt == 1 and t > at.timestamp()]

    def tried_after_second_failure() -> bool:
        failures = scenario.failures()
        return len(failures) >= 2 and bool(first_tries_after(failures[1][0]))

    with LocalWatch(scenario.log_dir, down_manifest.log_end_offset) as watch:
        for _ in range(4):
            scenario.produce_batch()
        wait_until(tried_after_second_failure, 40, "two failed runs and a try after the second", 0.1)
    assert not watch.violations, f"{len(watch.violations)} violations, the first: {watch.violations[:3]}"
    assert scenario.manifest().version == down_manifest.version
    assert all(attempt is not None for _, attempt, _ in proxy.reset_requests), proxy.reset_requests
    failures = scenario.failures()
    assert all(f"127.0.0.1:{proxy.port}" in error for _, _, _, error in failures[:2]), failures  # the store failed
    for at, count, delay, _ in failures[:2]:
        assert delay == 500 << (count - 1), failures
        # The log's time is cut to the ms, and taken just after the retry time was set.
        waited = min(first_tries_after(at)) - at.timestamp()
        assert waited >= (delay - 20) / 1000, (count, delay, waited, failures, proxy.reset_requests)
    proxy.up()
    recover(scenario, down_manifest)


@pytest.mark.slow
def test_a_range_read_waits_out_a_hung_store(scenario, proxy):
    """A range read (what a Spark task does) from offset 0 while the store hangs: the broker's
    remote read outlasts remote.fetch.max.wait.ms, so fetches come back empty below the high
    watermark (as Kafka's do). The read fetches again rather than failing, and once the store is
    back it returns every record once, in order."""
    import asyncio

    from client.cluster import Cluster
    from client.range_reader import read_range

    tier_some(scenario, 6)
    end = scenario.produced

    async def read_all() -> list[bytes]:
        cluster = Cluster(scenario.broker.bootstrap)
        try:
            values: list[bytes] = []
            async for batches in read_range(cluster, TOPIC, 0, 0, end, retry_timeout_s=60):
                values += [v for b in batches for v in b.body.column("value").to_pylist()]
            return values
        finally:
            await cluster.close()

    proxy.hang()
    threading.Timer(2.0, proxy.up).start()  # four expiries of the broker's 500 ms wait, then back
    assert asyncio.run(read_all()) == [value(i) for i in range(end)]
