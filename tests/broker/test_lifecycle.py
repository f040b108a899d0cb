"""A broker's life from the outside: one broker per data directory (the `.lock`), and a SIGTERM
under every kind of load ends in a bounded, clean stop whose data directory the next start takes
as it is (nothing to recover, nothing half written), with every acknowledged record in it."""
from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from broker.process import BrokerProcess
from client import Admin, Consumer, Producer
from common.child_process import launch_interpreter
from protocol import ApiKey

TABLE_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
STOP_BOUND_S = 60.0  # generous for a loaded 2-core machine; the drain itself is bounded by config


@pytest.mark.slow
def test_a_second_broker_on_the_same_log_dir_refuses_to_start(broker_factory, tmp_path: Path) -> None:
    """B on A's log.dir exits with LogDirInUseError's message; A keeps every record; after A is
    SIGKILLed (the kernel drops its flock) a new broker starts on the directory at once."""
    first = broker_factory("data").start()
    second = BrokerProcess(first.log_dir, output=tmp_path / "second.out")
    with pytest.raises(RuntimeError, match="did not start"):
        second.start(timeout_s=60)
    assert "is in use by another broker" in (tmp_path / "second.out").read_text()
    with Admin(first.bootstrap) as admin:
        admin.create_topic("t", partitions=1)
    with Producer(first.bootstrap) as producer:
        for i in range(200):
            producer.send("t", f"{i}".encode(), partition=0)
        producer.flush()
    first.kill()
    again = broker_factory("data").start()
    with Consumer(again.bootstrap) as consumer:
        consumer.assign([("t", 0)])
        consumer.seek_to_beginning()
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 200 and time.monotonic() < deadline:
            seen += [r.value for r in consumer.poll(1000)]
    assert seen == [f"{i}".encode() for i in range(200)]
    assert again.stop() == 0


def test_a_broker_started_as_a_user_starts_it_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """The suite forks its brokers (tests/helpers/forkserver.py); this one is a new interpreter
    running `python -m cli broker start`, as the demo, the benchmarks and a user start one."""
    broker = BrokerProcess(tmp_path / "user")
    broker.launcher = launch_interpreter  # type: ignore[misc]
    broker.start(timeout_s=60)
    try:
        assert broker.proc is not None
        command = Path(f"/proc/{broker.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert command[1:5] == [b"-m", b"cli", b"broker", b"start"]
        with Admin(broker.bootstrap) as admin:
            admin.create_topic("t", partitions=1)
            assert "t" in admin.list_topics()
    finally:
        assert broker.stop() == 0


def test_a_parked_fetch_is_answered_when_the_broker_stops(broker_factory, raw_client) -> None:
    """A fetch long-polling an idle partition (max_wait 60 s) when SIGTERM arrives is answered at
    once with what there is (no records), not dropped with its connection."""
    broker = broker_factory("parked").start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("idle", partitions=1)
    client = raw_client(broker.port, timeout_s=30)
    sent = client.send_frame(ApiKey.FETCH, {"max_wait_ms": 60_000, "min_bytes": 1, "topics": [
        {"name": "idle", "partitions": [{"partition": 0, "fetch_offset": 0}]}]})
    # Not a condition: no sign of a parked fetch shows outside the broker. A fetch not parked yet
    # would be answered as the broker stops all the same, so a slow machine weakens the test, never fails it.
    time.sleep(0.5)
    assert broker.proc is not None
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    correlation_id, control, _ = client.recv_response()
    assert correlation_id == sent and time.monotonic() - started < 10
    assert control["topics"][0]["partitions"][0]["error_code"] == 0, control
    assert broker.stop() == 0


def _produce_forever(bootstrap: str, topic: str, keyed: bool, stop: threading.Event, acked: list[int]) -> None:
    """Send batches until `stop` or the broker goes away; `acked` collects the ids acknowledged."""
    i = 0
    try:
        with Producer(bootstrap, linger_ms=2, delivery_timeout_ms=5_000) as producer:
            while not stop.is_set():
                ids = list(range(i, i + 200))
                keys = [b"k%d" % (n % 50) for n in ids] if keyed else [None] * len(ids)
                table = pa.table({"key": keys, "value": [b"%09d" % n + b"x" * 90 for n in ids]}, schema=TABLE_SCHEMA)
                results = producer.send_batch(topic, table, partition=0)
                producer.flush(30)
                if all(r.error is None and r.base_offset >= 0 for r in results):
                    acked.extend(ids)
                i += len(ids)
    except Exception:  # the broker stopped under us: what was acknowledged is in `acked`
        pass


def _fetch_forever(bootstrap: str, topic: str, stop: threading.Event) -> None:
    try:
        with Consumer(bootstrap) as consumer:
            consumer.assign([(topic, 0)])
            consumer.seek_to_beginning()
            while not stop.is_set():
                consumer.poll(200)
    except Exception:
        pass


@pytest.mark.slow
def test_sigterm_under_produce_fetch_cleaning_tiering_and_retention_stops_cleanly(broker_factory, tmp_path: Path) -> None:
    """SIGTERM while producers write a tiered topic and a compacted one, consumers fetch, the cleaner,
    tiering and retention run: exit 0 within the bound, no temporary files left, the restart
    recovers and truncates nothing, and every acknowledged record of the plain topic is there."""
    overrides = {"remote.log.storage.system.enable": True, "remote.storage.url": f"file://{tmp_path}/remote",
                 "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50,
                 "file.delete.delay.ms": 0, "log.cleaner.backoff.ms": 50, "shutdown.drain.timeout.ms": 3_000}
    broker = broker_factory("data", **overrides).start()
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("events", partitions=1, configs={
            "segment.bytes": 64 << 10, "remote.storage.enable": "true", "local.retention.bytes": 256 << 10,
            "retention.ms": -1})
        admin.create_topic("kv", partitions=1, configs={
            "segment.bytes": 32 << 10, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01,
            "segment.ms": 200})
    stop = threading.Event()
    acked: list[int] = []
    threads = [threading.Thread(target=_produce_forever, args=(broker.bootstrap, "events", False, stop, acked)),
               threading.Thread(target=_produce_forever, args=(broker.bootstrap, "kv", True, stop, [])),
               threading.Thread(target=_fetch_forever, args=(broker.bootstrap, "events", stop)),
               threading.Thread(target=_fetch_forever, args=(broker.bootstrap, "kv", stop))]
    for thread in threads:
        thread.start()
    try:
        # Segments roll, tier, expire and clean under 20k acknowledged records; on a slow machine the
        # stop comes after 60 s with fewer, which still tests it (hence no wait_until, which would fail).
        deadline = time.monotonic() + 60
        while len(acked) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acked, "nothing was acknowledged before the stop"
        started = time.monotonic()
        code = broker.stop(timeout_s=STOP_BOUND_S)
        took = time.monotonic() - started
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    out = broker.log_tail(200_000)
    assert code == 0, out[-4000:]
    assert took < STOP_BOUND_S
    assert "stopped cleanly" in out
    leftovers = [p.name for p in broker.log_dir.rglob("*") if p.suffix in (".cleaned", ".swap", ".tmp")]
    assert leftovers == []

    restarted = broker_factory("data", **overrides)
    restarted.output = tmp_path / "restart.out"
    restarted.start()
    loaded = re.search(r"recovered (\d+) bytes of (\d+) logs after their recovery points, truncated (\d+) bytes",
                       restarted.log_tail(200_000))
    assert loaded is not None and loaded.groups() == ("0", "0", "0"), restarted.log_tail()
    wanted = set(acked)
    seen: set[int] = set()
    with Consumer(restarted.bootstrap) as consumer:
        consumer.assign([("events", 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 120
        while not wanted <= seen and time.monotonic() < deadline:
            seen.update(int(r.value[:9]) for r in consumer.poll(1000))
    assert wanted <= seen, f"{len(wanted - seen)} acknowledged records missing"
    restarted.proc.send_signal(signal.SIGTERM)
    assert restarted.proc.wait(STOP_BOUND_S) == 0


def test_the_loops_a_stop_cancels_end_even_when_woken_in_the_same_turn() -> None:
    """A stop cancels the controller's loop and the replica fetchers and waits for them. Woken in
    the loop turn of the cancel (the stop of the other brokers of a cluster pokes the controller),
    a loop that waited with Python 3.11's `asyncio.wait_for` swallowed the cancel and ran on: the
    broker never exited and was SIGKILLed after the 30 s stop timeout."""
    from types import SimpleNamespace

    from broker.cluster.brokers import BrokerInfo, LiveBrokers
    from broker.cluster.controller import Controller
    from broker.cluster.replica_fetcher import ReplicaFetcher

    async def stop_while_woken() -> None:
        registration = SimpleNamespace(info=BrokerInfo(1, "127.0.0.1", 9092), lease=0, epoch=0)
        controller = Controller(None, None, LiveBrokers(), registration)  # type: ignore[arg-type]
        controller.start()
        # Loop time, not a wait on another thread: within it the controller's task (no I/O: no
        # store) runs up to its wait for a wake-up, whatever the machine's load.
        await asyncio.sleep(0.05)
        controller.poke()
        await asyncio.sleep(0)  # a loop turn: the wake-up is on its way to the loop
        await asyncio.wait_for(controller.stop(), 10)

        fetcher = ReplicaFetcher(SimpleNamespace(settings=None), leader=2)  # type: ignore[arg-type]

        async def pausing() -> None:  # as the fetcher's loop pauses between rounds
            while True:
                await fetcher._pause(30)
        loop = asyncio.ensure_future(pausing())
        await asyncio.sleep(0.05)  # loop time, as above: the task reaches its pause
        fetcher._wakeup.set()
        await asyncio.sleep(0)  # a loop turn: the wake-up is on its way
        loop.cancel()
        await asyncio.wait([loop], timeout=10)
        assert loop.cancelled()

    asyncio.run(stop_while_woken())
