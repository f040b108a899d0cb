"""The pymq segment format: what brokers write, tiered storage keeps and Spark reads or writes.

One package for every byte layout that leaves a process (docs/architecture.md), so the broker,
tiered storage and Spark executors share it and none of them imports another's internals:

    batch_body      the Arrow body of a record batch: its two schemas, building and writing it
    record          the record batch codec: 61-byte header + Arrow IPC body; validation at O(1)
                    Python per batch (arrow_ipc reads the IPC metadata, body_template writes
                    small bodies fast); record and body_template build on batch_body
    layout          topic names, segment file names and states (`{base_offset:020d}.log` ...)
    limits          integer limits of the fixed-width fields
    index_file      the sparse index files' codec: SparseIndex (in memory) of kind OFFSET_INDEX (.index)
                    or TIME_INDEX (.timeindex); broker.log.index_file keeps a local segment's in its file
    index_builder   which batches the two indexes name (Kafka's rule), for every segment writer
    segment_reader  reading a segment's batches from any pread (a local file or an object store)
    segment_writer  writing a sealed segment (log and indexes) to any binary files, without a broker
    segment_metadata  what a sealed segment's manifest entry says about it, computed from its bytes
    manifest        a partition's remote manifest: the list of its tiered segments
    compaction      the pure compaction core: latest value per key, offsets kept with gaps

Pure: bytes in, values out. File and network I/O belong to the callers (broker.log,
tiered_storage); the only imports from outside are pyarrow, numpy, crc32c, flatbuffers and the
error taxonomy (common.errors), so a Spark job can read and write segments and manifests without the broker.
"""
