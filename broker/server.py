"""The broker process: the asyncio TCP listener, background duties, lifecycle.

This is the only asyncio edge of the broker (docs/architecture.md, Layers), with the connections
it accepts (broker/connection.py: framing, dispatch, responses, and the bounds on what one client
may take); the broker owns what they share: the receive buffer pool, the byte budgets
(broker/backpressure.py), the connection quotas (broker/connection_quotas.py), and the duty that
closes connections that are idle or receive a request too slowly.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import protocol
from broker import background
from broker.backpressure import ByteBudget
from broker.cluster.broker_identity import new_incarnation
from broker.cluster.brokers import BrokerInfo, BrokerRegistration, LiveBrokers, broker_key
from broker.cluster.controller import Controller
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.metadata_listener import MetadataListener
from broker.cluster.metadata_store import Compare, MetadataStore
from broker.cluster.partition import LeaderAndIsr, Partition
from broker.cluster.peer_watch import PeerWatch
from broker.cluster.replica_fetcher import FetchSettings
from broker.cluster.session_fence import SessionFence
from broker.cluster.topics import MetadataChange, TopicRegistry
from broker.config import BrokerConfig
from broker.connection import Connection
from broker.connection_quotas import ConnectionQuotas
from broker.executors import BackgroundExecutors
from broker.handlers import RequestHandlers
from broker.log import LogCleaner, LogManager, TopicLogSpec
from broker.log.log_dir_lock import LogDirLock
from broker.log_writer import LogWriter
from broker.loop_lag import LoopLagProbe
from broker.metrics import serve_metrics
from broker.purgatory import DelayedOperationPurgatory
from broker.replica_manager import ClusterReplication, ReplicaManager
from broker.request_metrics import RequestMetrics
from common.errors import PymqError

log = logging.getLogger("pymq.server")

METADATA_FILE = "__cluster_metadata.json"
RECEIVE_BUFFER_BYTES = 256 << 10  # a connection's receive buffer for frames under 64 KiB (framing.py)
RECEIVE_BUFFERS_KEPT = 8  # receive buffers kept for reuse, not freed (framing.py ScratchPool)
SLOW_STOP_STEP_S = 1.0  # a shutdown step that takes longer is logged (a hung shutdown names its step)


class Broker:
    """One broker: metadata, logs, handlers, the TCP listener and background duties."""

    def __init__(self, config: BrokerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.log_dir = Path(config["log.dir"])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.dir_lock = LogDirLock(self.log_dir)  # before anything reads or writes the directory
        try:
            self.executors = BackgroundExecutors.from_config(config)
            self.clustered = config["metadata.store"] == "etcd"
            self.incarnation = new_incarnation()  # proves this process's identity to other brokers
            self.store = store or self._open_store()
            self.live_brokers = LiveBrokers()
            self.registry = TopicRegistry(self.store, config["broker.id"], config.log_defaults, self.live_brokers.racks)
            self.listener = MetadataListener(self.store, self.registry, self.live_brokers, self._apply_metadata,
                                             self._brokers_changed)
            self.registration: BrokerRegistration | None = None
            # In a cluster, no acting as leader on a view the others may have moved past
            # (broker/cluster/session_fence.py); a single broker's view is the only one.
            self.fence = SessionFence(config["broker.id"], lambda: self.listener.applied_revision) \
                if self.clustered else None
            self.controller: Controller | None = None
            # In a cluster, a peer whose process died is declared dead at once (its port refuses).
            self.peers = PeerWatch(self.store, self.live_brokers, lambda: config["broker.id"],
                                   _bind_host(config["host"])) if self.clustered else None
            self.logs = LogManager(self.log_dir, max_open_files=config["log.max.open.files"],
                                   remote_storage=config["remote.log.storage.system.enable"],
                                   producer_id_expiration_ms=config["producer.id.expiration.ms"],
                                   producer_state_max_producers=config["producer.state.max.producers.per.partition"])
            self.cleaner = LogCleaner.from_config(config, self.logs)
            self.purgatory = DelayedOperationPurgatory()
            self.writer = LogWriter(config["log.writer.offload.bytes"], config["log.writer.queued.max.bytes"])
            self.request_memory = ByteBudget("queued.max.request.bytes", config["queued.max.request.bytes"])
            self.response_descriptors = ByteBudget("queued.max.response.descriptors",
                                                   config["queued.max.response.descriptors"])
            self.connection_quotas = ConnectionQuotas.from_config(config)
            # One receive buffer serves every connection between its receives; a few spare ones
            # serve the connections that stop mid-frame (RECEIVE_BUFFERS_KEPT bounds what is kept).
            self.receive_buffers = protocol.ScratchPool(RECEIVE_BUFFER_BYTES, RECEIVE_BUFFERS_KEPT)
            self.loop_lag = LoopLagProbe()
            self.request_metrics = RequestMetrics()
            remote_logs = None
            if config["remote.log.storage.system.enable"]:
                from broker.remote_log.remote_log_manager import RemoteLogManager  # fsspec: only when tiering
                remote_logs = RemoteLogManager.from_config(config, self._remote_read_ready)
            cluster = ClusterReplication(
                FetchSettings(config["broker.id"], config["replica.fetch.wait.max.ms"],
                              config["replica.fetch.max.bytes"], config["replica.fetch.response.max.bytes"],
                              config["replica.fetch.backoff.ms"], local_host=_bind_host(config["host"]),
                              throttle_bytes_per_s=_rate_limit(config["replica.throttle.bytes.per.second"]),
                              incarnation=self.incarnation),
                self.live_brokers.address, self._write_isr, self.fence, config["replica.lag.time.max.ms"],
            ) if self.fence is not None else None  # the fence: a broker in a cluster
            self.replicas = ReplicaManager(config["broker.id"], self.logs, self.writer, self.purgatory, self.executors,
                                           remote_logs, cluster)
            self.handlers = RequestHandlers(config, self.registry, self.replicas, self.advertised, self.live_brokers,
                                            self.fence, lambda: self.incarnation, _bind_host(config["host"]))
            self.connections: set[Connection] = set()
            self.zero_copy = config["zero.copy"] and hasattr(os, "sendfile")
            self._server: asyncio.Server | None = None
            self._tasks: list[asyncio.Task[None]] = []
            self._stopped = asyncio.Event()
            self._stopping = False
            self._loop: asyncio.AbstractEventLoop | None = None
            self._metrics: WSGIServer | None = None
        except BaseException:
            self.dir_lock.release()  # a broker that failed to build leaves the directory free
            raise

    def _open_store(self) -> MetadataStore:
        if self.clustered:
            from broker.cluster.etcd_metadata_store import EtcdMetadataStore  # grpc: only for clusters

            return EtcdMetadataStore(self.config["etcd.endpoint"], f"pymq/{self.config['cluster.name']}/")
        return LocalMetadataStore(self.log_dir / METADATA_FILE, executor=self.executors.metadata)

    @property
    def port(self) -> int:
        assert self._server is not None, "broker not started"
        return self._server.sockets[0].getsockname()[1]

    def advertised(self) -> tuple[str, int]:
        return self.config["advertised.host"] or self.config["host"], self.config["advertised.port"] or self.port

    async def start(self) -> None:
        """Bind the port (not serving yet), register in the cluster, load the metadata and the
        logs of the partitions with a replica here, then follow the cluster and serve."""
        raise_open_files_limit()
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), self.config["host"], self.config["port"], reuse_address=True, backlog=1024,
            start_serving=False,
        )
        for sock in self._server.sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        host, port = self.advertised()
        self.registration = BrokerRegistration(
            self.store, BrokerInfo(self.config["broker.id"], host, port, self.config["broker.rack"],
                                   incarnation=self.incarnation),
            self.config["broker.session.timeout.ms"], self._registered, self.fence)
        await self.registration.register()
        await self.listener.load()
        self._registered(self.registration.info)
        broker_id = self.config["broker.id"]
        specs, states = {}, {}
        for name, info in self.registry.topics.items():
            hosted = frozenset(p for p, s in info.partitions.items() if broker_id in s.replicas)
            specs[name] = TopicLogSpec(info.topic_id, info.log_config(self.registry.log_defaults), info.partition_count,
                                       hosted=hosted)
            states.update({(name, p): LeaderAndIsr.of(info.partitions[p]) for p in hosted})
        await self.replicas.load(specs, states)
        if self.config["log.cleaner.enable"]:
            self.cleaner.start()
        for runtime in self.handlers.coordinators:
            await runtime.start()
        self.listener.start()
        self.registration.start()
        if self.clustered:
            self.controller = Controller(self.store, self.registry, self.live_brokers, self.registration,
                                         self.config["auto.leader.rebalance.enable"],
                                         self.config["leader.imbalance.check.interval.seconds"])
            self.controller.start()
        if self.peers is not None:
            self.peers.sync()
        await self._server.start_serving()
        if self.config["metrics.port"] >= 0:
            self._metrics = serve_metrics(self.config["host"], self.config["metrics.port"], self.replicas,
                                          lambda: len(self.connections), self.config, loop_lag=self.loop_lag,
                                          executors=self.executors.all(),
                                          budgets=[self.request_memory, self.writer.queue],
                                          requests=self.request_metrics, traffic=self.handlers.traffic,
                                          groups=self.handlers.groups.live_groups,
                                          controller=(lambda: self.controller is not None and self.controller.active)
                                          if self.clustered else None)
        self.loop_lag.start()
        self._tasks = [
            loop.create_task(background.every("isr-check", self.config["replica.lag.time.max.ms"] / 2000,
                                              self.replicas.check_isr)),
            loop.create_task(self._every("retention", "log.retention.check.interval.ms", self._retention)),
            loop.create_task(self._every("flush", "log.flush.scheduler.interval.ms", self.replicas.schedule_flushes)),
            loop.create_task(self._every("checkpoint", "log.flush.offset.checkpoint.interval.ms",
                                         self.replicas.request_checkpoint)),
            loop.create_task(background.every("idle-connections", 1.0, self._close_idle)),
        ]
        if self.replicas.remote_logs is not None:
            self.replicas.remote_logs.schedule()  # reads the manifests now: reads below the local start need them
            self._tasks.append(loop.create_task(self._every("tiering", "remote.log.manager.task.interval.ms", self._tier)))
        log.info("pymq broker %d listening on %s:%d (log.dir %s, %d topics, %s)", self.config["broker.id"],
                 self.config["host"], self.port, self.log_dir, len(self.registry.topics),
                 f"cluster {self.config['cluster.name']!r} on etcd {self.config['etcd.endpoint']}" if self.clustered
                 else "single broker")

    # -- the cluster -----------------------------------------------------------------------------

    def _registered(self, info: BrokerInfo) -> None:
        self.live_brokers.brokers[info.broker_id] = info

    def _brokers_changed(self, changed: set[int]) -> None:
        if self.controller is not None:
            self.controller.poke()
        if self.peers is not None and not self._stopping:
            self.peers.sync()

    async def _apply_metadata(self, changes: list[MetadataChange]) -> None:
        """Changes other brokers (or this one's controller) made: create, lead, follow or drop
        this broker's replicas; one at a time with admin requests. A topic's changes that arrive
        together are applied together: the logs of a new topic's replicas here are created in
        one batch (one filesystem sync, as on the broker that created it), not one by one."""
        async with self.handlers.admin.changes:
            for topic, whole, partitions in _by_topic(changes):
                if whole is None:
                    await self.replicas.delete_topic(topic)
                    continue
                info = self.registry.topics.get(topic)
                if info is None:
                    continue
                config = info.log_config(self.registry.log_defaults)
                spec = TopicLogSpec(info.topic_id, config, info.partition_count)
                if whole:
                    self.replicas.update_config(topic, config)
                    partitions = set(info.partitions)
                states = {p: info.partitions[p] for p in sorted(partitions) if p in info.partitions}
                new = [p for p, state in states.items()
                       if self.config["broker.id"] in state.replicas and not self.replicas.hosts(topic, p)]
                if new:
                    await self.replicas.create_partitions(topic, spec, new,
                                                          {(topic, p): LeaderAndIsr.of(states[p]) for p in new})
                for p, state in states.items():
                    if p not in new:
                        await self.replicas.become(topic, p, spec, LeaderAndIsr.of(state))
                    if self.controller is not None and (state.adding or state.removing):
                        self.controller.poke()  # a move may be complete now

    async def _write_isr(self, partition: Partition, state: LeaderAndIsr) -> bool:
        """Store a leader's ISR change: only over the state the leader acted on, and only while
        this broker is still registered under the epoch it had (not declared dead meanwhile)."""
        assert self.registration is not None
        info = self.registry.topics.get(partition.topic)
        current = None if info is None else info.partitions.get(partition.partition)
        if current is None or LeaderAndIsr.of(current) != partition.state:
            return False  # a newer state is on its way to `become`
        fence = [Compare.create_revision(broker_key(self.config["broker.id"]), "==", self.registration.epoch)]
        # Only the ISR changes: a reassignment in progress (adding, removing) stays as stored.
        return await self.registry.alter_partition_state(partition.topic, partition.partition,
                                                         dataclasses.replace(current, isr=state.isr), fence)

    async def stop(self) -> None:
        """Clean shutdown, in this order. Every step runs even if one before it failed (the
        failure is logged), so the logs are always closed, the lock released and `serve()` returns:

        0. controlled shutdown (in a cluster), while still serving: stop fetching, move the
           leadership of what this broker leads to other in-sync replicas and leave every ISR,
           and apply that here: the acks=all produces and fetches waiting here answer NOT_LEADER
           at once, and clients go to the new leaders instead of waiting for this broker;
        1. stop accepting connections and reading requests; parked fetches answer with what they have;
        2. wait up to shutdown.drain.timeout.ms for the requests already read to be answered, then
           close every connection;
        3. cancel the periodic duties and the coordinators' timers, and wait for their appends in
           flight;
        4. drain the log writer (its queued appends are acknowledged writes) and the flushes;
        5. close the metadata store, then stop the background pools once the work they run
           (retention, flushes, checkpoints a cancelled duty handed them) is done;
        6. stop the cleaner (a swap in progress finishes) and tiering (an upload in progress
           finishes; a throttle wait is cut short);
        7. close every log: fsync, recovery point = log end, offset checkpoints;
        8. stop the loop-lag probe and the metrics server, release log.dir's lock.
        """
        if self._stopping:
            return await self.wait_stopped()
        self._stopping = True
        ok = True
        log.info("pymq broker %d stopping", self.config["broker.id"])
        loop = asyncio.get_running_loop()
        for step, action in self._stop_steps():
            started = loop.time()
            try:
                await action()
            except Exception:
                ok = False
                log.exception("stopping: %s failed; going on with the next step", step)
            took = loop.time() - started
            if took >= SLOW_STOP_STEP_S:
                log.warning("stopping: %s took %.1f s", step, took)
        self._stopped.set()
        if ok:
            log.info("pymq broker %d stopped cleanly", self.config["broker.id"])
        else:
            log.error("pymq broker %d stopped, but a step of the shutdown failed (see above)", self.config["broker.id"])

    def _stop_steps(self) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
        remote_logs = self.replicas.remote_logs
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("controlled shutdown", self._controlled_shutdown),
            ("stop accepting", self._stop_accepting),
            ("leave the cluster", self._leave_cluster),
            ("drain requests", self._drain_requests),
            ("cancel periodic duties", self._cancel_duties),
            *((f"stop the {runtime.name} coordinator", runtime.stop) for runtime in self.handlers.coordinators),
            ("stop writing transaction markers", self.handlers.transactions.close),
            ("drain the log writer", self.writer.close),
            ("wait for flushes", self.replicas.wait_idle),
            ("close the metadata store", self.store.close),
            ("stop the background pools", lambda: asyncio.to_thread(self.executors.shutdown)),
            ("stop the log cleaner", lambda: asyncio.to_thread(self.cleaner.stop)),
        ]
        if remote_logs is not None:
            steps.append(("stop tiering", lambda: asyncio.to_thread(remote_logs.close)))
        steps += [
            ("close the logs", lambda: asyncio.to_thread(self.logs.close)),
            ("stop the loop-lag probe", self.loop_lag.stop),
            ("stop the metrics server", self._stop_metrics),
            ("release log.dir", self._release_dir),
        ]
        return steps

    async def _controlled_shutdown(self) -> None:
        """Kafka's controlled shutdown (step 0 of `stop`). Without it the partitions this broker
        led moved only once it deregistered, after it had stopped following the cluster: its
        acks=all produces waited out shutdown.drain.timeout.ms (or the producer's request timeout)
        for followers that had gone, and their partitions had no acknowledgement meanwhile."""
        if self.controller is None or self.registration is None or not self.registration.lease:
            return  # a single broker, or one that never registered: nobody to hand over to
        await self.replicas.stop_following()
        try:  # bounded: an unreachable metadata store must not hold the stop (the partitions move on deregistration)
            moved = await asyncio.wait_for(self.controller.controlled_shutdown(),
                                           self.config["shutdown.drain.timeout.ms"] / 1000)
        except (PymqError, TimeoutError) as err:
            log.warning("stopping: controlled shutdown did not complete (%s); the partitions led here move "
                        "when this broker deregisters", err)
            return
        await self._apply_metadata([MetadataChange("partition", topic, p) for topic, p in moved])

    async def _stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.stop_reading()
        self.purgatory.expire_all()

    async def _leave_cluster(self) -> None:
        """Resign as controller, deregister (the controller moves leadership at once instead of
        after the session timeout), stop following the cluster and fetching."""
        if self.peers is not None:
            await self.peers.stop()
        if self.controller is not None:
            await self.controller.stop()
        if self.registration is not None:
            await self.registration.stop()
        await self.listener.stop()
        await self.replicas.stop_following()

    async def _drain_requests(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.config["shutdown.drain.timeout.ms"] / 1000
        while any(conn.waiting for conn in self.connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        left = sum(conn.waiting for conn in self.connections)
        if left:
            log.warning("stopping: closing connections with %d requests unanswered after shutdown.drain.timeout.ms", left)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()

    async def _cancel_duties(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _stop_metrics(self) -> None:
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.shutdown)  # waits for its serve loop's next poll
            self._metrics.server_close()

    async def _release_dir(self) -> None:
        self.dir_lock.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- background duties -----------------------------------------------------------------------

    def _every(self, task: str, interval_key: str, duty: Callable[[], object]) -> Awaitable[None]:
        return background.every(task, self.config[interval_key] / 1000, duty)

    async def _retention(self) -> None:
        await self.replicas.run_retention(self.config["file.delete.delay.ms"])

    def _remote_read_ready(self, key: tuple[str, int]) -> None:
        """A remote read's answer waits (called on a reader thread): wake the fetches parked on its
        partition, on the loop the broker runs on."""
        if self._loop is None:
            return  # not started: no fetch can be parked
        try:
            self._loop.call_soon_threadsafe(self.purgatory.notify, key)
        except RuntimeError:
            pass  # the loop closed: the broker is stopping

    def _tier(self) -> None:
        """Submit the tiering tasks (they run in the remote log manager's threads)."""
        assert self.replicas.remote_logs is not None
        self.replicas.remote_logs.schedule()

    def _close_idle(self) -> None:
        """Close the connections idle for connections.max.idle.ms and those whose request has not
        arrived whole within request.read.timeout.ms."""
        now = asyncio.get_running_loop().time()
        for conn in list(self.connections):
            reason = conn.expired(now)
            if reason is not None and conn.transport is not None:
                log.info("closing connection %s: %s", conn.peer, reason)
                conn.transport.close()


def _by_topic(changes: list[MetadataChange]) -> list[tuple[str, bool | None, set[int]]]:
    """Consecutive changes of one topic merged, in order: (topic, True if the whole topic changed
    (created, configs, partition count) / False if only `partitions` did / None if deleted,
    partitions)."""
    steps: list[tuple[str, bool | None, set[int]]] = []
    for change in changes:
        whole = None if change.kind == "topic_deleted" else change.kind == "topic"
        if steps and steps[-1][0] == change.topic and steps[-1][1] is not None and whole is not None:
            topic, merged, partitions = steps[-1]
            merged = merged or whole
            steps[-1] = (topic, merged, set() if merged else partitions | {change.partition})
            continue
        steps.append((change.topic, whole, {change.partition} if whole is False else set()))
    return steps


def _rate_limit(bytes_per_s: int) -> int | None:
    """None for the unlimited default (2^63-1)."""
    return None if bytes_per_s >= 1 << 62 else bytes_per_s


def _bind_host(host: str) -> str | None:
    """The address a broker's own connections to other brokers leave from: its listener's, so
    that they come from the broker's address on a multi-homed machine (None for a wildcard)."""
    return None if host in ("", "0.0.0.0", "::") else host


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (Kafka's packaging asks for this too):
    connections and the segment file cache share it. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, err)
    return soft


async def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM / SIGINT, then shut down cleanly. A start that fails part way
    stops what it started (logs closed, log.dir unlocked) and raises."""
    broker = Broker(config)
    try:
        await broker.start()
    except BaseException:
        await broker.stop()
        raise
    print(f"pymq broker {config['broker.id']} listening on {config['host']}:{broker.port}", flush=True)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stopping.append(loop.create_task(broker.stop())) if not stopping else None)
    await broker.wait_stopped()


def run(config: BrokerConfig) -> None:
    """Entry point for `pymq broker start`: pick the event loop and serve."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config["event.loop"] == "uvloop":
        import uvloop

        uvloop.run(serve(config))
    else:
        asyncio.run(serve(config))
