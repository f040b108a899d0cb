"""A broker whose disk fills up (issue 34, item 14): produces are refused with the retriable
KAFKA_STORAGE_ERROR, the broker logs the state change once (with the directory and its free
bytes) and exports it; once space is freed, produces are accepted again, logged once and exported.

The disk is real: the broker runs under tests/faults/full_disk.py, on a small tmpfs of its own
mounted on its log.dir (in a mount namespace of its own), filled by a ballast file the test
writes through /proc/<pid>/root and later removes.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from broker.process import BrokerProcess
from protocol import ApiKey
from segment_format import batch_body, record
from tests.helpers.raw_client import RawClient
from tests.faults import full_disk
from tests.waiting import wait_until

DISK_BYTES = 8 << 20
KAFKA_STORAGE_ERROR = 56
TOPIC = "filling"

pytestmark = pytest.mark.skipif(not full_disk.available(), reason="cannot mount a tmpfs in a namespace here")


def produce(client: RawClient, batch: bytes) -> int:
    """The partition's error code of an acks=1 produce of `batch`."""
    control, _ = client.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 10_000, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(batch)}]}]}, batch)
    return control["topics"][0]["partitions"][0]["error_code"]


def logged(broker: BrokerProcess, log_dir: Path, state: str) -> list[str]:
    """The free bytes of each '<log_dir> <state> (N bytes free)' line the broker logged."""
    return re.findall(rf"log directory {re.escape(str(log_dir))} {state} \((\d+) bytes free\)",
                      broker.log_tail(1_000_000))


def test_a_full_disk_is_logged_once_per_change_and_exported(tmp_path: Path) -> None:
    """Fill the disk: produces are refused, one 'is full' line with the directory and free bytes,
    pymq_log_dir_disk_full 1; free it: produces pass, one 'has space again' line, the gauge 0."""
    log_dir = tmp_path / "broker"
    log_dir.mkdir()
    broker = BrokerProcess(log_dir, module="tests.faults.full_disk", env={"PYMQ_DISK_BYTES": str(DISK_BYTES)})
    broker.start()
    try:
        from client import Admin

        with Admin(broker.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1)
        disk = Path(f"/proc/{broker.pid}/root") / str(log_dir).lstrip("/")
        ballast = disk / "ballast"
        with open(ballast, "wb") as f:  # all but about 1 MiB of the disk
            f.write(b"\0" * (DISK_BYTES - (1 << 20)))
        batch = bytes(record.encode_batch(batch_body.make_body([os.urandom(1000) for _ in range(100)])))
        labels = f'{{dir="{log_dir}"}}'
        with RawClient(broker.port) as client:
            codes = [produce(client, batch) for _ in range(30)]  # 3 MB into 1 MiB of space
            assert codes[0] == 0 and codes[-1] == KAFKA_STORAGE_ERROR, codes
            full_lines = wait_until(lambda: logged(broker, log_dir, "is full"), 30, "the disk-full log line")
            assert len(full_lines) == 1 and int(full_lines[0]) < 1 << 20, full_lines
            metrics = broker.metrics()
            assert metrics[f"pymq_log_dir_disk_full{labels}"] == 1
            assert metrics[f"pymq_log_dir_free_bytes{labels}"] < 1 << 20
            ballast.unlink()
            assert produce(client, batch) == 0
            assert produce(client, batch) == 0
        space_lines = wait_until(lambda: logged(broker, log_dir, "has space again"), 30, "the space-again log line")
        assert len(space_lines) == 1 and int(space_lines[0]) > 4 << 20, space_lines
        metrics = broker.metrics()
        assert metrics[f"pymq_log_dir_disk_full{labels}"] == 0
        assert metrics[f"pymq_log_dir_free_bytes{labels}"] > 4 << 20
        assert len(logged(broker, log_dir, "is full")) == 1
    finally:
        broker.kill()
