"""Tiered storage on a 3-broker cluster, with an S3 endpoint (moto's server) shared by the brokers:

- a follower that was down while its leader uploaded and deleted its local segments does not copy
  that history back: it restarts its log where the remote log ends, with the log start and the
  leader epochs the manifest records, catches up and rejoins the ISR;
- a leader killed mid-stream is followed by one that takes the manifest over under its own epoch
  and uploads on from where the old one stopped, though its segments roll elsewhere: the remote
  log stays gapless;
- the replica that rebuilt from the remote tier, made leader, serves the whole history (remote
  and local) to a consumer, which the checker finds complete: nothing lost, moved, read twice or
  stored twice except what the producers resent.

The producers retry without idempotence (acks=all): a Produce request that times out under load
(a leader just elected, its follower slow) is sent again and may be stored twice, legitimately
(at least once). The final check tells those copies apart from a defect: each offset of the log
is read once, and no more values are stored twice than the producers resent."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin, Producer
from segment_format.manifest import PartitionManifest
from tests.e2e.checker import History
from tests.helpers.cluster_scenarios import partitions_of, read_all, wait_for, wait_for_full_isr
from tests.tiered_storage.backends import MotoServer, make_bucket, s3_options, s3_tiering
from tiered_storage import RemoteSegmentStore

TOPIC = "tiered"
VALUE = b"v" * 1000


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


def send(bootstrap: str, history: History, prefix: bytes, count: int) -> int:
    """`count` values of ~1 KB, acks=all, retried across a failover; how many records it resent."""
    with Producer(bootstrap, acks="all", linger_ms=5, request_timeout_ms=5_000, delivery_timeout_ms=60_000) as producer:
        for i in range(count):
            value = prefix + b"%06d" % i + VALUE
            history.sending(value)
            producer.send(TOPIC, value, partition=0,
                          on_delivery=lambda md, err, value=value: history.delivered(value, md.partition, md.offset, err))
        producer.flush()
        return producer.metrics()["record-retry-total"]


def local_bases(log_dir: Path) -> list[int]:
    return sorted(int(path.name[:20]) for path in (log_dir / f"{TOPIC}-0").glob("*.log"))


def epochs_file(log_dir: Path) -> str:
    return (log_dir / f"{TOPIC}-0" / "leader-epoch-checkpoint").read_text()


def assert_gapless(manifest: PartitionManifest) -> None:
    """Every offset from 0 to the remote log end, in exactly one segment."""
    segments = manifest.segments
    assert segments and segments[0].base_offset == 0 and manifest.log_start_offset == 0
    assert all(after.base_offset == before.next_offset for before, after in zip(segments, segments[1:])), \
        [(s.base_offset, s.next_offset) for s in segments]


def test_tiering_continues_across_failover_and_a_follower_far_behind_restarts_from_the_remote_tier(cluster, moto):
    options = s3_options(moto.endpoint_url)
    url = f"s3://{make_bucket(moto.endpoint_url)}/pymq"
    local = cluster(3, **{**s3_tiering(url, options), "remote.log.manager.task.interval.ms": 200,
                          "log.retention.check.interval.ms": 200})
    store = RemoteSegmentStore.from_url(url, options)
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={
            "min.insync.replicas": 2, "segment.bytes": 64 << 10, "remote.storage.enable": "true",
            "local.retention.bytes": 0, "retention.ms": -1})
        first = wait_for_full_isr(admin, TOPIC)[0]
        leader = local.brokers[first.leader]
        behind_id, other_id = [r for r in first.replicas if r != first.leader]
        behind = local.brokers[behind_id]

        # 1. A follower is away while the leader tiers and deletes its local history.
        behind.stop()
        wait_for(lambda: behind_id not in partitions_of(admin, TOPIC)[0].isr, 30, "the stopped follower to leave the ISR")
        resent = send(local.bootstrap, history, b"a", 2000)
        wait_for(lambda: local_bases(leader.log_dir)[0] > 0 and store.load_manifest(TOPIC, 0).log_end_offset >= 1000,
                 60, "the leader to tier and delete its first segments")

        # 2. It comes back below the leader's local log start: it restarts from the remote tier.
        behind.start()
        wait_for_full_isr(admin, TOPIC)
        assert local_bases(behind.log_dir)[0] > 0, "the returning follower copied the tiered history back"
        assert "restarted the log at the remote log end" in behind.output.read_text()
        assert epochs_file(behind.log_dir) == epochs_file(leader.log_dir)

        # 3. The leader dies; its successor takes the manifest over and tiers on.
        leader.kill()
        state = wait_for(lambda: (lambda p: p if p.leader not in (-1, first.leader) else None)(
            partitions_of(admin, TOPIC)[0]), 30, "a new leader")
        resent += send(local.bootstrap, history, b"b", 2000)
        manifest = wait_for(lambda: (lambda m: m if m.leader_epoch == state.leader_epoch and m.log_end_offset >= 3000
                                     else None)(store.load_manifest(TOPIC, 0)),
                            60, "the new leader to take the manifest over and upload the new records")
        assert_gapless(manifest)
        assert "took over the remote manifest" in local.brokers[state.leader].output.read_text()

        # 4. The replica rebuilt from the remote tier leads and serves the whole history.
        if state.leader != behind_id:
            local.brokers[other_id].kill()
            wait_for(lambda: partitions_of(admin, TOPIC)[0].leader == behind_id, 30, "the rebuilt replica to lead")
        assert local_bases(behind.log_dir)[0] > 0
    with Admin(behind.bootstrap) as admin:
        (end, _), = admin.list_offsets({(TOPIC, 0): -1}).values()
    read = read_all(behind.bootstrap, TOPIC, 1, history, "final")
    report = history.check()
    summary = f"read {read} records of a log ending at offset {end}, the producers resent {resent}: {report}"
    assert not (report.lost or report.moved or report.inconsistent or report.reordered or report.gaps
                or report.unknown), summary
    stored_twice = sum(len(offsets) - 1 for _, _, offsets in report.duplicated)
    assert read == end == 4000 + stored_twice, summary  # the log: the 4000 values and their copies, each read once
    assert stored_twice <= resent, summary  # only resent records are stored twice
    assert_gapless(store.load_manifest(TOPIC, 0))
