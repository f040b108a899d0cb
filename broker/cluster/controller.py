"""Controller: one broker, elected through the metadata store, moves leadership (Kafka's controller).

Election: the `controller` key, put under the broker's registration lease only if absent. The
key's create revision is the controller epoch; every write the controller makes is fenced on it,
so a deposed controller (its lease expired while it hung) cannot write after a successor took
over. The other brokers watch the key and campaign when it goes.

What the controller decides, for every partition it finds needing it (`decide`, a pure function):
- the leader is dead (its registration expired or it stopped): the first replica, in replica
  order, that is alive and in the ISR leads, under leader epoch + 1; the ISR loses the dead
  brokers. No such replica: the partition goes offline (leader -1, epoch + 1) with its ISR kept,
  so the last in-sync replica can lead again when it returns, unless the topic allows an unclean
  election, which picks any live replica and loses what only the ISR had;
- an offline partition one of whose ISR members came back gets it as leader;
- a follower in the ISR is dead: it leaves the ISR (without waiting replica.lag.time.max.ms);
- a reassignment whose target replicas are all in sync completes (the removed replicas leave);
- preferred leader election (`auto.leader.rebalance.enable`, every
  `leader.imbalance.check.interval.seconds`, or on request): a partition whose first replica is
  alive and in sync but does not lead gets it back as leader, epoch + 1.

Controlled shutdown (`Controller.controlled_shutdown`, Kafka's ControlledShutdown): a broker that
stops cleanly moves the leadership of what it leads to another in-sync replica and leaves every
ISR before it stops serving, with the same decision as if it were dead (`shutdown_decision`). The
stopping broker writes that itself, fenced on its own registration (as a leader's ISR changes), so
that it needs no round trip to the controller; the compare-and-set on each partition key orders it
with the controller's and the leaders' writes.

Every change is a compare-and-set on the partition key's mod revision, many partitions per
transaction; a partition that changed meanwhile (its leader shrank the ISR) is decided again
from its new state when the metadata listener brings it.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace

from broker import background
from broker.cluster.brokers import BrokerRegistration, LiveBrokers, broker_key
from broker.cluster.metadata_listener import CONTROLLER_KEY
from broker.cluster.metadata_store import Compare, Delete, Get, LeaseNotFoundError, MetadataStore, Put
from broker.cluster.topics import NO_LEADER, PartitionState, TopicRegistry, partition_key
from common.errors import MetadataStoreUnavailableError, PymqError

log = logging.getLogger("pymq.controller")

TXN_PARTITIONS = 1000  # partition states per transaction (each is a compare and a put)
SWEEP_S = 10.0  # the controller also re-decides every partition this often (a safety net)
SHUTDOWN_ATTEMPTS = 3  # controlled shutdown: rounds of moves (a round lost to a concurrent write is decided again)
SHUTDOWN_RETRY_S = 0.1  # and the pause between them, for the metadata listener to bring the newer states


def decide(state: PartitionState, live: set[int], unclean: bool, preferred: bool = False) -> PartitionState | None:
    """The state a partition should have given the live brokers, or None if it is right as is."""
    isr_alive = tuple(r for r in state.isr if r in live)
    if state.leader not in live:
        candidates = [r for r in state.replicas if r in isr_alive]
        if candidates:
            return replace(state, leader=candidates[0], leader_epoch=state.leader_epoch + 1, isr=isr_alive)
        if unclean:
            alive = [r for r in state.replicas if r in live]
            if alive:
                return replace(state, leader=alive[0], leader_epoch=state.leader_epoch + 1, isr=(alive[0],))
        if state.leader == NO_LEADER:
            return None
        return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1)
    if isr_alive != state.isr:
        return replace(state, isr=isr_alive)
    if state.adding or state.removing:
        return _complete_reassignment(state)
    first = state.replicas[0] if state.replicas else NO_LEADER
    if preferred and first != state.leader and first in live and first in state.isr:
        return replace(state, leader=first, leader_epoch=state.leader_epoch + 1)
    return None


def shutdown_decision(state: PartitionState, stopping: int, live: set[int]) -> PartitionState | None:
    """The state a partition should have before broker `stopping` shuts down cleanly: another
    in-sync replica leads (epoch + 1) and `stopping` leaves the ISR. None if it needs no change,
    or if no other live replica is in sync: then it keeps leading until it goes, as in Kafka
    (the partition goes offline when it deregisters, not before)."""
    if state.leader != stopping and stopping not in state.isr:
        return None
    decided = decide(state, live - {stopping}, unclean=False)
    if decided is None or decided.leader == NO_LEADER:
        return None
    return decided


def _complete_reassignment(state: PartitionState) -> PartitionState | None:
    """Once every target replica is in sync the move completes: the replicas become the targets,
    the removed ones leave the ISR (and stop hosting the partition), and a leader that is being
    removed hands over to the first in-sync target under a new epoch."""
    target = state.target_replicas
    if not all(r in state.isr for r in target):
        return None
    isr = tuple(r for r in state.isr if r in target)
    if state.leader in target:
        return PartitionState(state.leader, state.leader_epoch, target, isr)
    return PartitionState(isr[0], state.leader_epoch + 1, target, isr)


class Controller:
    """Campaigns for the controller key and, while holding it, keeps partitions led. Loop-local."""

    def __init__(self, store: MetadataStore, registry: TopicRegistry, brokers: LiveBrokers,
                 registration: BrokerRegistration, auto_rebalance: bool = True, rebalance_interval_s: float = 300) -> None:
        self.store = store
        self.registry = registry
        self.brokers = brokers
        self.registration = registration
        self.auto_rebalance = auto_rebalance
        self.rebalance_interval_s = rebalance_interval_s
        self.epoch = 0  # the create revision of our controller key, while active
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def broker_id(self) -> int:
        return self.registration.info.broker_id

    @property
    def active(self) -> bool:
        return self.epoch != 0 and self.brokers.controller == self.broker_id

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="controller")

    def poke(self) -> None:
        """Something changed (brokers came or went, the controller key moved): decide again."""
        self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.active:
            try:  # a successor campaigns at once; only our own key goes (fenced on its epoch)
                await self.store.txn([Compare.create_revision(CONTROLLER_KEY, "==", self.epoch)], [Delete(CONTROLLER_KEY)])
            except PymqError as err:
                log.info("resigning as controller: %s", err)
        self.epoch = 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_rebalance = loop.time()
        while True:
            # Cleared before deciding, not after: a poke that comes while this round decides and
            # writes (a partition changed meanwhile) makes another round at once, not at the sweep.
            self._wakeup.clear()
            try:
                if not self.active:
                    await self._campaign()
                if self.active:
                    now = loop.time()
                    preferred = self.auto_rebalance and now - last_rebalance >= self.rebalance_interval_s
                    if preferred:  # at a fixed rate, as Kafka's scheduler: a failed round waits for the next
                        last_rebalance = now
                    await self.reconcile(preferred=preferred)
            except (MetadataStoreUnavailableError, LeaseNotFoundError) as err:
                log.warning("controller: %s", err)
            except PymqError:
                log.exception("controller: deciding partitions failed")
            await background.wait_event(self._wakeup, self._wait_s(last_rebalance + self.rebalance_interval_s - loop.time()))

    def _wait_s(self, rebalance_due_in_s: float) -> float:
        """How long to wait for a poke: the sweep, or less when this controller's next
        preferred-leader election (every rebalance_interval_s) is due sooner."""
        if not (self.active and self.auto_rebalance):
            return SWEEP_S
        return max(0.0, min(SWEEP_S, rebalance_due_in_s))

    async def _campaign(self) -> None:
        """Take the controller key if it is free (under our registration lease: it goes with us)."""
        if self.brokers.controller not in (-1, self.broker_id) or not self.registration.lease:
            self.epoch = 0
            return
        result = await self.store.txn(
            [Compare.version(CONTROLLER_KEY, "==", 0)],
            [Put(CONTROLLER_KEY, {"broker_id": self.broker_id, "broker_epoch": self.registration.epoch},
                 lease=self.registration.lease)],
            [Get(CONTROLLER_KEY)])
        if result.succeeded:
            self.epoch = result.responses[0].create_revision  # type: ignore[union-attr]
            self.brokers.controller = self.broker_id
            log.info("broker %d is the controller (epoch %d)", self.broker_id, self.epoch)
        else:
            found = result.responses[0].get(CONTROLLER_KEY)  # type: ignore[union-attr]
            self.brokers.controller = found.value["broker_id"] if found else -1
            self.epoch = 0

    async def reconcile(self, preferred: bool = False, topics: Iterable[str] | None = None) -> int:
        """Decide every partition (of `topics`, default all) and write the changes; returns how
        many partitions changed."""
        live = set(self.brokers.brokers)
        changes: list[tuple[str, int, PartitionState]] = []
        for name in list(self.registry.topics if topics is None else topics):
            info = self.registry.topics.get(name)
            if info is None:
                continue
            unclean = info.log_config(self.registry.log_defaults).unclean_leader_election_enable
            for p, state in info.partitions.items():
                decided = decide(state, live, unclean, preferred)
                if decided is not None:
                    changes.append((name, p, decided))
        written = 0
        for start in range(0, len(changes), TXN_PARTITIONS):
            written += await self._write(changes[start:start + TXN_PARTITIONS])
        if written:
            log.info("controller: changed %d partition states (live brokers %s)", written, sorted(live))
        return written

    async def controlled_shutdown(self) -> list[tuple[str, int]]:
        """This broker stops cleanly: move the leadership of every partition it leads to another
        in-sync replica and take it out of every ISR (`shutdown_decision`), retrying what a
        concurrent write got to first. Returns the partitions changed; the caller applies them
        here at once (acks=all produces waiting here answer NOT_LEADER). The caller stops this
        broker's replica fetchers first: a leader must not add it to an ISR again."""
        me = self.broker_id
        fence = [Compare.create_revision(broker_key(me), "==", self.registration.epoch)]
        moved: list[tuple[str, int]] = []
        for attempt in range(SHUTDOWN_ATTEMPTS):
            live = set(self.brokers.brokers)
            changes = [(name, p, decided) for name, info in list(self.registry.topics.items())
                       for p, state in info.partitions.items()
                       if (decided := shutdown_decision(state, me, live)) is not None]
            if not changes:
                break
            if attempt:
                log.info("controlled shutdown of broker %d: %d partitions left to move", me, len(changes))
            written = 0
            for start in range(0, len(changes), TXN_PARTITIONS):
                batch = changes[start:start + TXN_PARTITIONS]
                written += await self._write(batch, fence)
                moved += [(name, p) for name, p, state in batch
                          if name in self.registry.topics and self.registry.topics[name].partitions.get(p) == state]
            if written == len(changes):
                break
            await asyncio.sleep(SHUTDOWN_RETRY_S)  # the listener brings what other writers changed
        log.info("controlled shutdown of broker %d: moved %d partitions", me, len(moved))
        return moved

    async def _write(self, changes: list[tuple[str, int, PartitionState]], fence: Sequence[Compare] = ()) -> int:
        """One transaction for the batch; if a partition in it changed meanwhile, each on its own.
        Fenced on this controller's epoch unless another `fence` is given."""
        as_controller = not fence
        fence = list(fence) or [Compare.create_revision(CONTROLLER_KEY, "==", self.epoch)]
        compares, puts = list(fence), []
        for name, p, state in changes:
            key = partition_key(name, p)
            compares.append(Compare.mod_revision(key, "==", self.registry.topics[name].revisions.get(p, 0)))
            puts.append(Put(key, state.to_json()))
        result = await self.store.txn(compares, puts, [Get(CONTROLLER_KEY)])
        if result.succeeded:
            for name, p, state in changes:
                self.registry.written(name, p, state, result.revision)
            return len(changes)
        if as_controller and not result.responses[0]:  # type: ignore[index]
            self.epoch = 0  # our controller key is gone: another broker controls now
            return 0
        written = 0
        for name, p, state in changes:
            try:
                written += await self.registry.alter_partition_state(name, p, state, fence)
            except PymqError as err:
                log.info("controller: %s-%d not changed: %s", name, p, err)
        return written
