"""ReplicaManager paths that a real broker reaches only in a narrow window, driven here with the
real log, log writer and purgatories."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from segment_format import batch_body, record
from broker.cluster.partition import LeaderAndIsr
from broker.config import LogConfig
from common.errors import NotLeaderError, UnknownTopicOrPartitionError
from broker.log import LogManager, TopicLogSpec, UnifiedLog
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperationPurgatory
from broker.replica_manager import ReplicaManager
from tests.waiting import wait_until_async


def hold_appends(monkeypatch) -> threading.Event:
    """Appends on the writer thread wait, from now on, until the returned event is set (10 s at most)."""
    release = threading.Event()
    real_append = UnifiedLog.append_as_leader

    def held_append(self, payload, leader_epoch, coordinator=False):
        release.wait(10)
        return real_append(self, payload, leader_epoch, coordinator)

    monkeypatch.setattr(UnifiedLog, "append_as_leader", held_append)
    return release


def _one_record() -> memoryview:
    return memoryview(record.encode_batch(batch_body.make_body([b"v"], timestamps_ms=batch_body.now_ms())))



def test_an_append_queued_when_its_topic_is_deleted_is_unknown_topic(tmp_path: Path, monkeypatch):
    """The append waits on the writer thread while the topic is deleted: the producer is told
    UNKNOWN_TOPIC_OR_PARTITION (the partition is gone), not KAFKA_STORAGE_ERROR (a failed disk)."""
    async def scenario() -> None:
        logs = LogManager(tmp_path / "data")
        replicas = ReplicaManager(0, logs, LogWriter(offload_bytes=0, max_queued_bytes=1 << 20), DelayedOperationPurgatory())
        await replicas.create_partitions("t", TopicLogSpec(None, LogConfig(), 1), [0],
                                         {("t", 0): LeaderAndIsr(0, 0, (0,), (0,))})
        release = hold_appends(monkeypatch)
        payload = _one_record()
        pending = replicas.append("t", 0, payload, acks=1, timeout_ms=1000)
        assert not isinstance(pending, tuple) and asyncio.iscoroutine(pending)
        appended = asyncio.ensure_future(pending)
        await asyncio.sleep(0)  # a loop turn, not a wait on time: the append is handed to the (held) writer
        await replicas.delete_topic("t")
        release.set()
        with pytest.raises(UnknownTopicOrPartitionError, match="deleted while the append was queued"):
            await appended
        logs.close()

    asyncio.run(scenario())


def test_an_acks_all_produce_answers_when_the_isr_shrinks_while_the_handler_awaits_another_partition(tmp_path: Path):
    """A produce to two partitions whose acks=all both wait: the handler awaits them one after
    the other. The controller drops a dead follower from the second partition's ISR while the
    handler still awaits the first, which moves that partition's high watermark past the append.
    The second answers as soon as the handler gets to it: it was parked when appended, so the
    ISR change completed it. (Parked only when awaited, it waited for another append or follower
    fetch to move the high watermark again: after a producer's last send, until its timeout.)"""

    async def scenario() -> None:
        logs = LogManager(tmp_path / "data")
        replicas = ReplicaManager(0, logs, LogWriter(offload_bytes=1 << 20, max_queued_bytes=1 << 20),
                                  DelayedOperationPurgatory())
        full = LeaderAndIsr(0, 0, (0, 1, 2), (0, 1, 2))
        spec = TopicLogSpec(None, LogConfig(), 1)
        await replicas.create_partitions("t", spec, [0, 1], {("t", 0): full, ("t", 1): full})
        payload = _one_record()
        first = replicas.append("t", 0, payload, acks=-1, timeout_ms=5_000)
        second = replicas.append("t", 1, payload, acks=-1, timeout_ms=5_000)
        assert asyncio.iscoroutine(first) and asyncio.iscoroutine(second)  # both wait for their followers

        async def handler() -> list:
            return [await first, await second]  # as ProduceHandler awaits a request's partitions

        answered = asyncio.ensure_future(handler())
        await asyncio.sleep(0)  # a loop turn, not a wait on time: the handler awaits the first partition
        shrunk = LeaderAndIsr(0, 0, (0, 1, 2), (0,))  # brokers 1 and 2 died: the controller's new ISR
        await replicas.become("t", 1, spec, shrunk)
        await wait_until_async(lambda: len(replicas.produce_purgatory) == 1, 10,
                               "the ISR change completes the second partition's parked append")
        assert not answered.done()  # the first partition still waits for its followers
        await replicas.become("t", 0, spec, shrunk)
        infos = await asyncio.wait_for(answered, 3)  # before the 5 s produce timeout
        assert [info.first_offset for info in infos] == [0, 0]
        assert len(replicas.produce_purgatory) == 0
        logs.close()

    asyncio.run(scenario())


def test_an_acks_all_append_queued_when_leadership_moves_answers_not_leader_at_once(tmp_path: Path, monkeypatch):
    """The append waits on the writer thread while the partition's leadership moves (a controlled
    shutdown hands it over): the producer is told NOT_LEADER when the append is done, and retries
    on the new leader. (Parked after the move had failed the purgatory, it waited for its request
    timeout: followers fetch from the new leader, nothing would move the high watermark here.)"""
    async def scenario() -> None:
        logs = LogManager(tmp_path / "data")
        replicas = ReplicaManager(0, logs, LogWriter(offload_bytes=0, max_queued_bytes=1 << 20), DelayedOperationPurgatory())
        spec = TopicLogSpec(None, LogConfig(), 1)
        await replicas.create_partitions("t", spec, [0], {("t", 0): LeaderAndIsr(0, 0, (0, 1, 2), (0, 1, 2))})
        release = hold_appends(monkeypatch)
        payload = _one_record()
        appended = asyncio.ensure_future(replicas.append("t", 0, payload, acks=-1, timeout_ms=30_000))
        await asyncio.sleep(0)  # a loop turn, not a wait on time: the append is handed to the (held) writer
        await replicas.become("t", 0, spec, LeaderAndIsr(1, 1, (0, 1, 2), (1, 2)))  # broker 0 handed over
        release.set()
        with pytest.raises(NotLeaderError, match="leadership moved to broker 1"):
            await asyncio.wait_for(appended, 10)
        logs.close()

    asyncio.run(scenario())
