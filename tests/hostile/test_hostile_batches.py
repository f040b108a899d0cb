"""Hostile producers against a real broker (issue 34): since the leader decodes every producer's body
before the append, a body is also a way to make the broker allocate and compute. A flood of
decompression bombs (a few KiB on the wire, 100 MiB once decompressed) and poison bodies is refused
batch by batch, the broker's peak memory does not grow by the bombs' size, and another client is
answered within a generous bound meanwhile.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from common.errors import NONE, CorruptMessageError, MessageTooLargeError
from protocol import ApiKey
from segment_format import batch_body, record
from tests.broker.forged_batches import POISON_BATCHES, TS, decompression_bomb

BOMB_DECOMPRESSED_BYTES = 100 << 20  # above the default message.decompressed.max.bytes (64 MiB)
FLOOD_ROUNDS = 20
ANSWER_BOUND_S = 10.0


def _produce(client, topic: str, payload: bytes) -> dict:
    control = {"acks": 1, "topics": [{"name": topic, "partitions": [{"partition": 0, "size": len(payload)}]}]}
    reply, _ = client.request(ApiKey.PRODUCE, control, payload)
    assert reply["error_code"] == NONE, reply
    return reply["topics"][0]["partitions"][0]


def _peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the broker's peak RSS from /proc")
@pytest.mark.slow
def test_a_flood_of_decompression_bombs_and_poison_is_refused_while_others_are_served(broker_factory, raw_client):
    """FLOOD_ROUNDS rounds of a real zstd bomb (100 MiB of zeros), a forged one declaring 1 TiB
    and every kind of poison: each is refused with its named error, the broker's peak RSS grows
    by less than one bomb, and a second client's produces are acknowledged within ANSWER_BOUND_S."""
    broker = broker_factory("hostile-batches").start()
    admin = raw_client(broker.port, timeout_s=30)
    reply, _ = admin.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": "hostile", "num_partitions": 1, "replication_factor": 1, "configs": {}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    bomb = bytes(record.encode_batch(batch_body.make_body([bytes(BOMB_DECOMPRESSED_BYTES)], timestamps_ms=TS),
                                     compression="zstd"))
    assert len(bomb) < 64 << 10
    attacks = [(bomb, MessageTooLargeError), (bytes(decompression_bomb("zstd", 1 << 40)), MessageTooLargeError)]
    attacks += [(bytes(make()), CorruptMessageError) for _, make, _ in POISON_BATCHES]
    assert _produce(admin, "hostile", bytes(record.encode_batch(batch_body.make_body([b"warm"], timestamps_ms=TS))))[
        "error_code"] == NONE
    peak_before = _peak_rss_bytes(broker.proc.pid)

    answered: list[float] = []
    done = threading.Event()

    def bystander() -> None:
        client = raw_client(broker.port, timeout_s=ANSWER_BOUND_S)
        good = bytes(record.encode_batch(batch_body.make_body([b"bystander"], timestamps_ms=TS)))
        while not done.is_set():
            started = time.monotonic()
            assert _produce(client, "hostile", good)["error_code"] == NONE
            answered.append(time.monotonic() - started)
            time.sleep(0.05)  # pacing, not a wait: a bystander's steady produces

    thread = threading.Thread(target=bystander, daemon=True)
    thread.start()
    attacker = raw_client(broker.port, timeout_s=30)
    try:
        for _ in range(FLOOD_ROUNDS):
            for payload, error in attacks:
                result = _produce(attacker, "hostile", payload)
                assert result["error_code"] == error.code and result["base_offset"] == -1, result
    finally:
        done.set()
        thread.join(ANSWER_BOUND_S + 5)
    assert answered and max(answered) < ANSWER_BOUND_S, f"bystander waited {max(answered, default=-1):.1f} s"
    growth = _peak_rss_bytes(broker.proc.pid) - peak_before
    assert growth < BOMB_DECOMPRESSED_BYTES // 2, f"peak RSS grew by {growth >> 20} MiB"
    end, _ = admin.request(ApiKey.LIST_OFFSETS, {"topics": [{"name": "hostile", "partitions": [
        {"partition": 0, "timestamp": -1}]}]})
    assert end["topics"][0]["partitions"][0]["offset"] == 1 + len(answered)
