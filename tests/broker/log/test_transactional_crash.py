"""A process appending transactions and markers to a real log is SIGKILLed mid-stream: reopened,
the log holds an index entry for every ABORT marker the process reported written, the open
transactions hold the last stable offset, and idempotent retries are still recognised."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from broker.log import UnifiedLog
from segment_format import record
from tests.helpers.logs import SMALL, idempotent_batch
from tests.waiting import wait_until

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from broker.log import UnifiedLog
    from segment_format import record
    from tests.helpers.logs import SMALL, idempotent_batch

    partition_log = UnifiedLog.open(Path(sys.argv[1]), "topic", 0, SMALL)
    sequences = {}
    for round in range(10_000):
        producer = 100 + round % 3
        sequence = sequences.get(producer, 0)
        first = partition_log.append_as_leader(
            idempotent_batch(producer, 0, sequence, attributes=record.TRANSACTIONAL_BIT), 0).first_offset
        sequences[producer] = sequence + 3
        abort = round % 2 == 0
        marker = partition_log.append_transaction_marker(producer, 0, not abort, 0, 0).first_offset
        print("marker", producer, first, marker, int(abort), flush=True)
        # An open transaction of producer 200 from round 5 on, never ended.
        if round == 5:
            first = partition_log.append_as_leader(
                idempotent_batch(200, 0, 0, attributes=record.TRANSACTIONAL_BIT), 0).first_offset
            print("open", 200, first, flush=True)
""")


REPOSITORY = Path(__file__).resolve().parents[3]


def test_sigkill_mid_stream_keeps_every_reported_abort_and_open_transaction(tmp_path: Path):
    directory = tmp_path / "topic-0"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    reported: list[list[str]] = []
    try:
        assert child.stdout is not None
        wait_until(lambda: reported.append(child.stdout.readline().split()) or len(reported) > 60, 60,
                   "60 reported markers")
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    aborted = [(int(r[1]), int(r[2])) for r in reported if r[:1] == ["marker"] and r[4] == "1"]
    [open_first] = [int(r[2]) for r in reported if r[:1] == ["open"]]
    partition_log = UnifiedLog.open(directory, "topic", 0, SMALL)
    try:
        partition_log.update_high_watermark(partition_log.log_end_offset)
        found = partition_log.collect_aborted_transactions(0, partition_log.log_end_offset)
        assert found[:len(aborted)] == aborted  # markers written after the last report may follow
        assert partition_log.last_stable_offset == open_first
        stored = [h for s in partition_log.segments() for _, h in record.iter_batches(s.log_path.read_bytes())]
        assert len(partition_log.segments()) > 3 and stored[-1].next_offset == partition_log.log_end_offset
        # The open transaction's producer retries its batch: a duplicate, answered with its offset.
        retry = partition_log.append_as_leader(idempotent_batch(200, 0, 0, attributes=record.TRANSACTIONAL_BIT), 0)
        assert retry.first_offset == open_first
    finally:
        partition_log.close()
