"""Tiered storage: upload throughput (S3 on moto, file://), Spark batch reads of the S3 tier against
Parquet, and a consumer reading the remote tier through the broker (cold, cached) against local.

Every store is real: S3 is moto's S3 server (`python -m moto.server`, started here on a free
loopback port, killed by PID) reached through s3fs, exactly as a broker configured with
`remote.storage.url=s3://...` and `remote.storage.s3.*` reaches AWS; file:// is a folder under a
temporary directory on the same disk as the broker's log.

- upload:  per store, a 1-partition topic of `--upload-mb` MiB of 1 KiB values in `--segment-mb`
           segments is produced while the broker runs *without* remote.log.storage.system.enable
           (the topic has remote.storage.enable, so nothing tiers yet); the broker restarts with
           tiering on and the benchmark polls DescribeTiering every 20 ms: the rate is the
           manifest's bytes from the first committed upload to the last (the segments after the
           first one, i.e. the broker's steady upload rate: CRC scan of the segment, PUT of
           .index/.timeindex/.log, the read-back verify, the manifest commit). Then, with the broker
           stopped, `RemoteSegmentStore.upload_segment` runs on the same segment files to another
           prefix of the same store, split into the segment scan (metadata + CRCs), the upload with
           its verify read-back, and `verify_upload` alone (a second read-back): the store without
           the broker.
- spark:   `--records` 100-byte values over `--partitions` partitions (64 MiB segments,
           local.retention.bytes 1) tiered by the broker to a moto bucket; once the sealed segments
           are uploaded, each partition gets one more record after segment.ms so that the segment
           holding the last of the `--records` rolls and tiers too: every row read lives only in
           S3 (the local segments are deleted). Timed: `spark.read.format("pymq")` with
           `remoteStorage.url` (executors read S3 directly) and endingOffsets at the `--records`
           rows, `selectExpr("count(*)", "sum(length(value))")` (every row's value touched) and
           the same into the `noop` sink (every column), against the same rows written once
           (untimed) to a local Parquet file and read with the same queries. Also the same scan
           without `remoteStorage.url` (the broker serves it from the tier).
- consume: the broker restarts (its remote reader cache empty, `remote.log.reader.cache.size.bytes`
           large enough to hold the topic); a `Consumer` process (`poll_arrow`, as
           consume_throughput) assigned every partition from offset 0 reads the tiered topic:
           cold (first read after the restart), then cached (again, while the cache holds it);
           against the same rows in a topic without tiering (local segments, page cache warm).

    python -m benchmarks.tiered_storage [--only upload spark consume] [--quick] [--records 10000000]
                                        [--partitions 4] [--upload-mb 1024] [--segment-mb 64] [--repeat 2]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import MB, SummaryRow
from tests.tiered_storage import backends
from tests.tiered_storage.backends import REGION, free_port

DEFAULT_RECORDS = 10_000_000
RECORD_SIZE = 100
UPLOAD_VALUE_SIZE = 1024
WORKLOADS = ["upload", "spark", "consume"]
TOPIC = "tiered"
LOCAL_TOPIC = "local-copy"
SEGMENT_MS = 10_000


# -- moto's S3 server --------------------------------------------------------------------------


class MotoServer(backends.MotoServer):
    """The tests' moto launcher (tests/tiered_storage/backends.py), also registered for the
    harness cleanup, with the settings that reach it from a broker, Spark and the store."""

    def start(self, timeout_s: float = 30.0) -> "MotoServer":
        super().start(timeout_s)
        assert self.proc is not None
        _live_moto[self.proc.pid] = self
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _live_moto.pop(self.proc.pid, None)
        super().stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def store_options(self) -> dict[str, Any]:
        """RemoteSegmentStore.from_url's options for this endpoint."""
        return {"endpoint_url": self.endpoint_url, "key": "testing", "secret": "testing", "region": REGION}

    def broker_overrides(self) -> dict[str, Any]:
        return {"remote.storage.s3.endpoint.url": self.endpoint_url, "remote.storage.s3.access.key": "testing",
                "remote.storage.s3.secret.key": "testing", "remote.storage.s3.region": REGION}

    def spark_options(self) -> dict[str, str]:
        return {"remoteStorage.s3.endpointUrl": self.endpoint_url, "remoteStorage.s3.accessKey": "testing",
                "remoteStorage.s3.secretKey": "testing", "remoteStorage.s3.region": REGION}

    def make_bucket(self) -> str:
        from tiered_storage import RemoteSegmentStore

        bucket = f"pymq-{uuid.uuid4().hex[:12]}"
        RemoteSegmentStore.from_url(f"s3://{bucket}", self.store_options()).fs.mkdir(bucket)
        return bucket


_live_moto: dict[int, MotoServer] = {}


def _stop_motos() -> None:
    for server in list(_live_moto.values()):
        with contextlib.suppress(Exception):
            server.stop()


def install_cleanup() -> None:
    harness.install_cleanup()
    import atexit

    atexit.register(_stop_motos)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        _stop_motos()
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        raise SystemExit(128 + signum)

    for sig in previous:
        signal.signal(sig, on_signal)


# -- helpers -----------------------------------------------------------------------------------


def tiering_overrides(url: str, **extra: Any) -> dict[str, Any]:
    return harness.broker_overrides(**{
        "remote.log.storage.system.enable": True, "remote.storage.url": url,
        "remote.log.manager.task.interval.ms": 100, "log.retention.check.interval.ms": 200,
        "file.delete.delay.ms": 0}, **{k.replace(".", "__"): v for k, v in extra.items()})


def describe(bootstrap: str, topic: str) -> list[Any]:
    from client import Admin

    with Admin(bootstrap) as admin:
        return admin.describe_tiering([topic])


def produce_chunks(bootstrap: str, topic: str, records: int, record_size: int, partitions: int,
                   chunk: int) -> float:
    """`records` values of `record_size` bytes, chunk i to partition i % partitions; seconds."""
    from client import Producer

    buffer = harness.payload_buffer(record_size, chunk)
    started = time.perf_counter()
    with Producer(bootstrap, linger_ms=20, batch_size=1 << 20) as producer:
        for i, start in enumerate(range(0, records, chunk)):
            producer.send_batch(topic, harness.value_table(buffer, record_size, min(chunk, records - start), i),
                                partition=i % partitions)
        producer.flush()
    return time.perf_counter() - started


def sealed_segments(log_dir: Path, topic: str, partitions: int) -> list[tuple[int, Path, int, int]]:
    """(partition, directory, base offset, .log bytes) of every segment but each partition's last."""
    out = []
    for p in range(partitions):
        directory = log_dir / f"{topic}-{p}"
        bases = sorted(int(path.name[:20]) for path in directory.glob("*.log"))
        for base in bases[:-1]:
            out.append((p, directory, base, (directory / f"{base:020d}.log").stat().st_size))
    return out


def scrape(port: int, prefix: str = "pymq_remote_read") -> dict[str, float]:
    """The broker's remote reader metrics (sums over labels)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(prefix):
                name, _, value = line.rpartition(" ")
                name = name.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(value)
    return out


# -- upload throughput -------------------------------------------------------------------------


def upload_run(backend: str, total_bytes: int, segment_bytes: int, partitions: int) -> dict[str, Any]:
    from segment_format.layout import SegmentFiles
    from tiered_storage import RemoteSegmentStore
    from tiered_storage.remote_store import _local_metadata

    work = harness.make_temp_dir(f"pymq-tier-upload-{backend}-")
    moto = broker = None
    try:
        if backend == "s3":
            moto = MotoServer(work / "moto.log").start()
            bucket = moto.make_bucket()
            url, raw_url, options = f"s3://{bucket}/pymq", f"s3://{bucket}/raw", moto.store_options()
            store_overrides = moto.broker_overrides()
        else:
            url, raw_url, options = f"file://{work}/remote", f"file://{work}/raw", {}
            store_overrides = {}
        overrides = tiering_overrides(url, **store_overrides)
        overrides["remote.log.storage.system.enable"] = False  # produce first: nothing tiers yet
        broker = harness.BrokerProcess(overrides, data_dir=work).start()
        topic = "upload"
        harness.create_topic(broker.bootstrap, topic, partitions, {
            "segment.bytes": segment_bytes, "remote.storage.enable": "true", "retention.ms": -1,
            "local.retention.bytes": -1})
        records = total_bytes // UPLOAD_VALUE_SIZE
        produce_s = produce_chunks(broker.bootstrap, topic, records, UPLOAD_VALUE_SIZE, partitions,
                                   max(1, min(65_536, records // 16)))
        broker.stop()
        sealed = sealed_segments(broker.log_dir, topic, partitions)
        sealed_bytes = sum(s[3] for s in sealed)
        quiet = harness.wait_for_quiet()
        broker.overrides["remote.log.storage.system.enable"] = True
        broker.start()
        pids = {"broker": broker.pid, **({"moto": moto.pid} if moto else {})}
        meter = harness.CpuMeter(pids).start()
        t_ready = time.perf_counter()
        timeline: list[tuple[float, int, int]] = []  # (seconds after ready, remote bytes, segments)
        last = (-1, -1)
        deadline = time.monotonic() + 1800
        while True:
            rows = describe(broker.bootstrap, topic)
            now = time.perf_counter() - t_ready
            remote = sum(max(r.remote_bytes, 0) for r in rows)
            segments = sum(max(r.remote_segments, 0) for r in rows)
            if any(r.failures for r in rows):
                raise RuntimeError(f"tiering failed: {[r.last_error for r in rows if r.failures]}")
            if (remote, segments) != last:
                timeline.append((round(now, 3), remote, segments))
                last = (remote, segments)
            if remote >= sealed_bytes:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"tiering did not catch up: {remote} of {sealed_bytes} bytes")
            time.sleep(0.02)
        cpu = meter.stop()
        broker.stop()
        first = next(t for t in timeline if t[1] > 0)
        done = timeline[-1]
        steady_bytes = done[1] - first[1]
        steady_s = done[0] - first[0]
        broker_result = {
            "sealed_segments": len(sealed), "sealed_bytes": sealed_bytes, "produce_s": round(produce_s, 2),
            "first_upload_s": first[0], "caught_up_s": done[0],
            "mb_per_s": round(steady_bytes / steady_s / MB, 1) if steady_s > 0 else None,
            "mb_per_s_from_start": round(done[1] / done[0] / MB, 1),
            "load_before_pct": quiet, "timeline": timeline, **cpu}
        print(f"{backend} broker tiering", {k: v for k, v in broker_result.items() if k != "timeline"}, flush=True)

        # The store alone, on the same segment files (page cache warm), to another prefix.
        store = RemoteSegmentStore.from_url(raw_url, dict(options))
        quiet = harness.wait_for_quiet()
        scan_s = upload_s = verify_s = 0.0
        raw_pids = {"moto": moto.pid} if moto else {}
        meter = harness.CpuMeter(raw_pids).start()
        for p, directory, base, _size in sealed:
            files = SegmentFiles(directory, base)
            t0 = time.perf_counter()
            metadata = _local_metadata(files)
            t1 = time.perf_counter()
            segment = store.upload_segment(topic, p, files, metadata)
            t2 = time.perf_counter()
            store.verify_upload(topic, p, segment)
            t3 = time.perf_counter()
            scan_s, upload_s, verify_s = scan_s + t1 - t0, upload_s + t2 - t1, verify_s + t3 - t2
        raw_cpu = meter.stop()
        raw = {"segments": len(sealed), "bytes": sealed_bytes, "scan_s": round(scan_s, 3),
               "upload_with_verify_s": round(upload_s, 3), "verify_alone_s": round(verify_s, 3),
               "mb_per_s": round(sealed_bytes / (scan_s + upload_s) / MB, 1),
               "put_only_mb_per_s": round(sealed_bytes / max(upload_s - verify_s, 1e-9) / MB, 1),
               "verify_mb_per_s": round(sealed_bytes / verify_s / MB, 1),
               "scan_mb_per_s": round(sealed_bytes / scan_s / MB, 1),
               "load_before_pct": quiet, **raw_cpu}
        print(f"{backend} upload_segment", raw, flush=True)
        return {"backend": backend, "partitions": partitions, "segment_bytes": segment_bytes, "broker": broker_result,
                "raw": raw}
    finally:
        if moto is not None:
            moto.stop()
        if broker is not None:
            broker.kill()
        harness.remove_temp_dir(work)


# -- the S3-tiered topic: Spark and consumer reads ---------------------------------------------


class TieredTopic:
    """A broker tiering `records` 100-byte values of TOPIC to a moto bucket, every row's segment
    uploaded and deleted locally; optionally LOCAL_TOPIC holds the same rows without tiering."""

    def __init__(self, records: int, partitions: int, segment_bytes: int, cache_bytes: int) -> None:
        self.records, self.partitions, self.segment_bytes = records, partitions, segment_bytes
        self.work = harness.make_temp_dir("pymq-tier-topic-")
        self.moto = MotoServer(self.work / "moto.log").start()
        self.bucket = self.moto.make_bucket()
        self.url = f"s3://{self.bucket}/pymq"
        self.metrics_port = free_port()
        self.broker = harness.BrokerProcess(tiering_overrides(self.url, **self.moto.broker_overrides(), **{
            "remote.log.reader.cache.size.bytes": cache_bytes, "metrics.port": self.metrics_port}),
            data_dir=self.work)
        self.ends: dict[int, int] = {}
        self.info: dict[str, Any] = {}
        self.local_loaded = False

    def start(self) -> "TieredTopic":
        self.broker.start()
        bootstrap = self.broker.bootstrap
        harness.create_topic(bootstrap, TOPIC, self.partitions, {
            "segment.bytes": self.segment_bytes, "segment.ms": SEGMENT_MS, "remote.storage.enable": "true",
            "local.retention.bytes": 1, "retention.ms": -1})
        chunk = max(1, min(250_000, self.records // (self.partitions * 4)))
        load_s = produce_chunks(bootstrap, TOPIC, self.records, RECORD_SIZE, self.partitions, chunk)
        loaded = time.perf_counter()
        self.ends = harness.topic_end_offsets(bootstrap, TOPIC, self.partitions)
        assert sum(self.ends.values()) == self.records, self.ends
        # The segment holding each partition's last rows rolls at the next append after segment.ms.
        time.sleep(SEGMENT_MS / 1000 + 1)
        self._one_more_record()
        deadline = time.monotonic() + 1800
        while True:
            rows = describe(bootstrap, TOPIC)
            if all(r.remote_log_end_offset >= self.ends[r.partition] and r.local_log_start_offset >= self.ends[r.partition]
                   for r in rows):
                break
            if any(r.failures for r in rows):
                raise RuntimeError(f"tiering failed: {[r.last_error for r in rows if r.failures]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tiering did not catch up: {rows}")
            time.sleep(0.1)
        self.info = {"records": self.records, "partitions": self.partitions, "segment_bytes": self.segment_bytes,
                     "load_s": round(load_s, 2), "tiered_after_load_s": round(time.perf_counter() - loaded, 1),
                     "remote_bytes": sum(r.remote_bytes for r in rows), "remote_segments": sum(r.remote_segments for r in rows),
                     "local_bytes_left": sum(r.local_bytes for r in rows), "ends": self.ends}
        print("tiered topic", self.info, flush=True)
        return self

    def _one_more_record(self) -> None:
        import pyarrow as pa

        from client import Producer

        with Producer(self.broker.bootstrap, linger_ms=0) as producer:
            for p in range(self.partitions):
                producer.send_batch(TOPIC, pa.table({"value": [b"roll"]}), partition=p)
            producer.flush()

    def load_local_copy(self) -> None:
        if self.local_loaded:
            return
        harness.create_topic(self.broker.bootstrap, LOCAL_TOPIC, self.partitions,
                             {"segment.bytes": self.segment_bytes, "retention.ms": -1})
        chunk = max(1, min(250_000, self.records // (self.partitions * 4)))
        produce_chunks(self.broker.bootstrap, LOCAL_TOPIC, self.records, RECORD_SIZE, self.partitions, chunk)
        self.local_loaded = True

    def ending_offsets(self) -> str:
        return json.dumps({TOPIC: {str(p): end for p, end in self.ends.items()}})

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.stop()
        self.moto.stop()
        harness.remove_temp_dir(self.work)


def timed(df: Any, kind: str) -> tuple[float, Any]:
    started = time.perf_counter()
    if kind == "agg":
        out = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
        result: Any = (out["n"], out["bytes"])
    else:
        df.write.format("noop").mode("overwrite").save()
        result = None
    return time.perf_counter() - started, result


def register_ceiling_source(spark: Any, records: int, tasks: int) -> None:
    """format("pymq_ceiling"): what Spark's Python Data Source protocol alone reaches on this
    machine. Its `tasks` tasks yield `records` rows of the pymq schema (100-byte values, as the
    benchmark's) from ready Arrow batches: no I/O, no decode. Defined here in full, so that
    Spark's workers unpickle it by value."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_datasource.schema import spark_schema

    def batches(rows: int, per_batch: int = 16_384) -> Any:
        import numpy as np
        import pyarrow as pa

        from spark_datasource.schema import arrow_schema

        n = per_batch
        letters = np.random.default_rng(7).integers(ord("A"), ord("Z") + 1, n * RECORD_SIZE, dtype=np.uint8)
        offsets = np.arange(n + 1, dtype=np.int32) * RECORD_SIZE
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(letters)])
        batch = pa.RecordBatch.from_arrays([
            pa.nulls(n, pa.binary()), values, pa.array([TOPIC] * n), pa.array(np.zeros(n, np.int32)),
            pa.array(np.arange(n, dtype=np.int64)), pa.array(np.zeros(n, np.int64)).cast(pa.timestamp("us", tz="UTC")),
            pa.array(np.zeros(n, np.int32))], schema=arrow_schema(False))
        for start in range(0, rows, n):
            yield batch.slice(0, min(n, rows - start))

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(records * (i + 1) // tasks - records * i // tasks) for i in range(tasks)]

        def read(self, partition: InputPartition) -> Any:
            return batches(partition.value)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pymq_ceiling"

        def schema(self) -> Any:
            return spark_schema(False)

        def reader(self, schema: Any) -> Any:
            return Reader()

    spark.dataSource.register(Source)


def copy_tier_to_file(tiered: TieredTopic) -> str:
    """The tiered topic's objects (manifests and segments) copied from moto to a local folder: the
    same remote layout behind a file:// URL, to read with no HTTP server in the way."""
    from tiered_storage import RemoteSegmentStore

    store = RemoteSegmentStore.from_url(tiered.url, tiered.moto.store_options())
    target = tiered.work / "file-tier"
    started = time.perf_counter()
    store.fs.get(store.root, str(target), recursive=True)
    print(f"copied the S3 tier to {target} in {time.perf_counter() - started:.1f} s", flush=True)
    return f"file://{target}"


def spark_read(spark: Any, tiered: TieredTopic, repeat: int) -> dict[str, Any]:
    from spark_datasource.batch_reader import PymqBatchReader
    from spark_datasource.options import SourceOptions
    from spark_datasource.ranges import RangePartition
    from spark_datasource.remote_ranges import RemoteRangePartition

    base = {"kafka.bootstrap.servers": tiered.broker.bootstrap, "subscribe": TOPIC,
            "endingOffsets": tiered.ending_offsets()}
    remote = {**base, "remoteStorage.url": tiered.url, **tiered.moto.spark_options()}
    planned = PymqBatchReader(SourceOptions.parse(remote, False)).partitions()
    remote_parts = [p for p in planned if isinstance(p, RemoteRangePartition)]
    tasks = {"remote_range_tasks": len(remote_parts), "segments_planned": sum(len(p.segments) for p in remote_parts),
             "broker_range_tasks": sum(isinstance(p, RangePartition) and p.range.size > 0 for p in planned),
             "tasks": len(planned)}
    print("planned", tasks, flush=True)
    file_url = copy_tier_to_file(tiered)
    file_tier = {**base, "remoteStorage.url": file_url}
    register_ceiling_source(spark, tiered.records, len(planned))
    parquet = tiered.work / "same-rows.parquet"
    started = time.perf_counter()
    spark.read.format("pymq").options(**remote).load().write.mode("overwrite").parquet(str(parquet))
    parquet_write_s = time.perf_counter() - started
    expected = (tiered.records, tiered.records * RECORD_SIZE)
    out: dict[str, Any] = {"records": tiered.records, **tasks, "parquet_write_s": round(parquet_write_s, 2),
                           "parquet_bytes": harness.dir_size_bytes(parquet)}
    sources = {"s3": lambda: spark.read.format("pymq").options(**remote).load(),
               "file": lambda: spark.read.format("pymq").options(**file_tier).load(),
               "ceiling": lambda: spark.read.format("pymq_ceiling").load(),
               "parquet": lambda: spark.read.parquet(str(parquet))}
    for kind in ("agg", "noop"):
        times: dict[str, list[float]] = {name: [] for name in sources}
        quiet = harness.wait_for_quiet()
        meter = harness.CpuMeter({"moto": tiered.moto.pid, "broker": tiered.broker.pid}).start()
        for _ in range(repeat):  # alternate, so a disturbance hits all
            for name, df in sources.items():
                seconds, result = timed(df(), kind)
                if kind == "agg" and tuple(result) != expected:
                    raise RuntimeError(f"{name} read {result}, expected {expected}")
                times[name].append(round(seconds, 3))
        cpu = meter.stop()
        rates = {name: tiered.records / min(t) for name, t in times.items()}
        out[kind] = {**{f"{name}_s": t for name, t in times.items()},
                     **{f"{name}_rows_per_s": round(rate) for name, rate in rates.items()},
                     **{f"{name}_ratio": round(rate / rates["parquet"], 3) for name, rate in rates.items()
                        if name != "parquet"},
                     "ratio": round(rates["s3"] / rates["parquet"], 3), "load_before_pct": quiet, **cpu}
        print(f"spark {kind}", out[kind], flush=True)
    # The same aggregate without remoteStorage.url: the broker serves the rows from the tier.
    seconds, result = timed(spark.read.format("pymq").options(**base).load(), "agg")
    if tuple(result) != expected:
        raise RuntimeError(f"broker read {result}, expected {expected}")
    out["via_broker_agg"] = {"seconds": round(seconds, 3), "rows_per_s": round(tiered.records / seconds)}
    print("spark via broker", out["via_broker_agg"], flush=True)
    return out


def probe_store(tiered: TieredTopic, threads: int = 2) -> dict[str, Any]:
    """What the S3 endpoint alone serves: every remote segment's `.log` read in the Spark
    tasks' ranged GETs (READ_AHEAD_BYTES), by `threads` readers at once (as Spark local[2]'s
    two tasks), with nothing else running. The time is a floor for any reader of these bytes on
    this machine; a GET's cost for two sizes shows how it grows (moto copies the whole object for
    every ranged GET)."""
    from concurrent.futures import ThreadPoolExecutor

    from spark_datasource.remote_ranges import READ_AHEAD_BYTES
    from tiered_storage import RemoteSegmentStore

    store = RemoteSegmentStore.from_url(tiered.url, tiered.moto.store_options())
    reads = [(p, segment, position, min(READ_AHEAD_BYTES, segment.size_bytes - position))
             for p in range(tiered.partitions) for segment in store.load_manifest(TOPIC, p).segments
             for position in range(0, segment.size_bytes, READ_AHEAD_BYTES)]
    total = sum(size for *_, size in reads)
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(lambda r: len(store.read_range(TOPIC, *r)), reads))
    seconds = time.perf_counter() - started
    assert got == total, (got, total)
    out: dict[str, Any] = {"bytes": total, "gets": len(reads), "threads": threads, "seconds": round(seconds, 2),
                           "mb_per_s": round(total / seconds / MB, 1)}
    segment = store.load_manifest(TOPIC, 0).segments[0]
    path = store.object_path(TOPIC, 0, segment.log)
    for label, length in (("get_64kib_ms", 64 << 10), ("get_window_ms", READ_AHEAD_BYTES)):
        started = time.perf_counter()
        for _ in range(5):
            store.fs.cat_file(path, start=0, end=min(length, segment.size_bytes))
        out[label] = round((time.perf_counter() - started) / 5 * 1000, 1)
    print("store probe", out, flush=True)
    return out


def consume_remote(tiered: TieredTopic) -> dict[str, Any]:
    from benchmarks.consume_throughput import consume_worker

    tiered.load_local_copy()

    def read(topic: str, label: str) -> dict[str, Any]:
        quiet = harness.wait_for_quiet()
        before = scrape(tiered.metrics_port)
        meter = harness.CpuMeter({"moto": tiered.moto.pid}).start()
        result = harness.run_worker(consume_worker, name=f"consumer-{label}", timeout_s=1800,
                                    bootstrap=tiered.broker.bootstrap, topic=topic, partitions=tiered.partitions,
                                    expected=tiered.records, mode="arrow", max_records=None,
                                    broker_pid=tiered.broker.pid, idle_timeout_s=30.0)
        result.update(meter.stop())
        result["load_before_pct"] = quiet
        after = scrape(tiered.metrics_port)
        result["remote_reader"] = {k.replace("pymq_remote_read_", "").replace("pymq_remote_", ""):
                                   round(after.get(k, 0) - (0 if k.endswith("cache_bytes") else before.get(k, 0)))
                                   for k in after}
        if result["stalled"]:
            raise RuntimeError(f"{label}: read {result['records']} of {tiered.records}")
        print(f"consume {label}", result, flush=True)
        return result

    # A restart empties the broker's remote reader cache; wait until the manifests are read again.
    tiered.broker.stop()
    tiered.broker.start()
    deadline = time.monotonic() + 120
    while not all(r.manifest_version > 0 for r in describe(tiered.broker.bootstrap, TOPIC)):
        if time.monotonic() > deadline:
            raise RuntimeError("the restarted broker did not read its manifests")
        time.sleep(0.1)
    cold = read(TOPIC, "cold")
    cached = read(TOPIC, "cached")
    local = [read(LOCAL_TOPIC, f"local{i}") for i in range(2)]
    return {"cold": cold, "cached": cached, "local": max(local, key=lambda r: r["records_per_s"]),
            "local_runs": local}


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiered_storage", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS, help="spark / consume: 100-byte records")
    parser.add_argument("--partitions", type=int, default=4, help="spark / consume: topic partitions")
    parser.add_argument("--upload-mb", type=int, default=1024, help="upload: MiB of 1 KiB values per store")
    parser.add_argument("--upload-partitions", type=int, default=1)
    parser.add_argument("--segment-mb", type=float, default=64.0)
    parser.add_argument("--stores", nargs="*", choices=["s3", "file"], default=["s3", "file"])
    parser.add_argument("--quick", action="store_true", help="~20x smaller volumes and segments")
    parser.add_argument("--only", nargs="*", choices=WORKLOADS, default=WORKLOADS)
    parser.add_argument("--repeat", type=int, default=2, help="timed Spark reads per source (best is reported)")
    args = parser.parse_args(argv)
    records = harness.scaled(args.records, args.quick)
    upload_bytes = harness.scaled(args.upload_mb * MB, args.quick)
    segment_bytes = harness.scaled(int(args.segment_mb * MB), args.quick)
    install_cleanup()
    results: dict[str, Any] = {"records": records, "partitions": args.partitions, "segment_bytes": segment_bytes,
                               "quick": args.quick}
    if "upload" in args.only:
        results["upload"] = [upload_run(store, upload_bytes, segment_bytes, args.upload_partitions)
                             for store in args.stores]
    if "spark" in args.only or "consume" in args.only:
        # The remote reader cache holds the whole topic for the cached read (plus room for indexes).
        cache_bytes = max(256 << 20, records * (RECORD_SIZE + 20) * 2)
        tiered = TieredTopic(records, args.partitions, segment_bytes, cache_bytes)
        try:
            tiered.start()
            results["topic"] = tiered.info
            if "spark" in args.only:
                from spark_datasource import local_spark

                spark = local_spark("pymq-tier-bench", **{"spark.driver.memory": "4g"})
                try:
                    results["spark"] = spark_read(spark, tiered, args.repeat)
                    results["spark"]["store"] = probe_store(tiered)
                finally:
                    spark.stop()
            if "consume" in args.only:
                results["consume"] = consume_remote(tiered)
                results["consume"]["cache_bytes"] = cache_bytes
        finally:
            tiered.stop()
    results["summary"] = [row.as_dict() for row in summary(results)]
    harness.print_table("tiered storage", results["summary"])
    print("wrote", harness.write_results("tiered_storage", results))
    return results


def summary(results: dict[str, Any]) -> list[SummaryRow]:
    rows = []
    for run in results.get("upload", []):
        b, raw = run["broker"], run["raw"]
        name = "S3 (moto)" if run["backend"] == "s3" else "file://"
        rows.append(SummaryRow(f"tiering upload to {name}, broker", "(report)", f"{b['mb_per_s']} MB/s", None,
                               f"{b['sealed_segments']} segments of {run['segment_bytes'] / MB:g} MiB, "
                               f"first commit to caught up; {b['mb_per_s_from_start']} MB/s from broker start"))
        rows.append(SummaryRow(f"`upload_segment` to {name}, store alone", "(report)", f"{raw['mb_per_s']} MB/s", None,
                               f"scan {raw['scan_mb_per_s']}, put {raw['put_only_mb_per_s']}, "
                               f"verify read-back {raw['verify_mb_per_s']} MB/s"))
    spark = results.get("spark")
    if spark:
        for kind, what in (("agg", "count(*), sum(length(value))"), ("noop", "noop sink, every column")):
            r = spark[kind]
            rows.append(SummaryRow(f"Spark batch read from the S3 tier, {spark['records']:,} x 100 B, {what}",
                                   ">= 0.5x Parquet", f"{harness.rate(r['s3_rows_per_s'])} ({r['ratio']:.2f}x Parquet)",
                                   r["ratio"] >= 0.5, f"Parquet {harness.rate(r['parquet_rows_per_s'])}; "
                                   f"{spark['remote_range_tasks']} remote-range tasks over {spark['segments_planned']} "
                                   f"segments, {spark['broker_range_tasks']} broker-range tasks"))
            rows.append(SummaryRow(f"  same rows, the tier copied to file:// ({what})", "(report)",
                                   f"{harness.rate(r['file_rows_per_s'])} ({r['file_ratio']:.2f}x Parquet)", None,
                                   "the same remote read with no HTTP server in the way"))
            rows.append(SummaryRow(f"  Spark's Python Data Source ceiling ({what})", "(report)",
                                   f"{harness.rate(r['ceiling_rows_per_s'])} ({r['ceiling_ratio']:.2f}x Parquet)", None,
                                   "ready Arrow batches, no I/O, same rows and tasks"))
        st = spark["store"]
        rows.append(SummaryRow("moto alone serving the segments' bytes (2 readers)", "(report)", f"{st['mb_per_s']} MB/s",
                               None, f"{st['bytes'] / MB:.0f} MB in {st['seconds']} s, {st['gets']} GETs: a floor "
                               "for any reader of this store here"))
        v = spark["via_broker_agg"]
        rows.append(SummaryRow("same aggregate without remoteStorage.url (broker reads the tier)", "(report)",
                               harness.rate(v["rows_per_s"]), None, f"{v['seconds']} s"))
    consume = results.get("consume")
    if consume:
        for label in ("cold", "cached", "local"):
            r = consume[label]
            rows.append(SummaryRow(f"consumer `poll_arrow()` from offset 0, {label}", "(report)",
                                   f"{harness.rate(r['records_per_s'])}, {r['mb_per_s']} MB/s", None,
                                   f"broker {r.get('broker_cpu_pct')} % / consumer {r.get('consumer_cpu_pct')} % "
                                   f"/ moto {r.get('moto_cpu_pct')} % of a core"))
    return rows


if __name__ == "__main__":
    main()
