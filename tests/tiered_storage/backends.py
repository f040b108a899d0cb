"""What the remote store's tests run against: moto's S3 server as a child process (stopped by PID),
store options for it, and partitions written by the broker's own log."""
from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from segment_format import batch_body, record
from broker.config import LogConfig
from broker.log import LogManager, TopicLogSpec
from common.child_process import die_with_parent
from tiered_storage import RemoteSegmentStore

TOPIC = "events"
TOPIC_ID = "0123456789abcdef0123456789abcdef"
BASE_TS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=8 << 10, index_interval_bytes=1024, retention_ms=-1)
REGION = "eu-west-1"  # not us-east-1: s3fs sends it as the bucket's LocationConstraint


class MotoServer:
    """`python -m moto.server` on 127.0.0.1 at a free port; `stop()` ends it by PID."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> MotoServer:
        self.port = free_port()
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto server did not start:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)  # a poll of the condition above (the process and its port), with its own error

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def s3_options(endpoint_url: str, **overrides: object) -> dict[str, object]:
    """What a broker's config gives the store for an S3-compatible endpoint; timeouts short enough
    that an outage fails a test in seconds."""
    return {"endpoint_url": endpoint_url, "key": "testing", "secret": "testing", "region": REGION,
            "connect_timeout_s": 1, "read_timeout_s": 5, "max_attempts": 2, **overrides}


def make_bucket(endpoint_url: str) -> str:
    """A fresh bucket (one per test keeps tests apart on the shared server); returns its name."""
    bucket = f"pymq-{uuid.uuid4().hex[:12]}"
    store = RemoteSegmentStore.from_url(f"s3://{bucket}", s3_options(endpoint_url))
    store.fs.mkdir(bucket)
    return bucket


def write_partition(root: Path, appends: int = 60) -> Path:
    """Append `appends` batches of 1-3 records of 300 bytes as leader (epoch 0, then 2) through a
    real LogManager and close it cleanly; returns the partition directory (several segments)."""
    manager = LogManager(root, lambda: BASE_TS)
    try:
        partition_log = manager.load({TOPIC: TopicLogSpec(TOPIC_ID, CONFIG, 1)})[(TOPIC, 0)]
        for i in range(appends):
            n = i % 3 + 1
            body = batch_body.make_body([b"%03d" % i + b"x" * 297] * n, timestamps_ms=[BASE_TS + 7 * i - j for j in range(n)])
            partition_log.append_as_leader(record.encode_batch(body), 0 if i < appends // 2 else 2)
    finally:
        manager.close()
    return root / f"{TOPIC}-0"


def s3_tiering(url: str, store_options: dict[str, str]) -> dict[str, object]:
    """Broker settings that tier to the `s3` fixture's bucket, quickly (50 ms tiering and retention checks)."""
    return {"remote.log.storage.system.enable": True, "remote.storage.url": url,
            "remote.storage.s3.endpoint.url": store_options["endpoint_url"],
            "remote.storage.s3.access.key": store_options["key"], "remote.storage.s3.secret.key": store_options["secret"],
            "remote.storage.s3.region": store_options["region"],
            "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50, "file.delete.delay.ms": 0}
