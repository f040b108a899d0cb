"""Partition logs on local disk (docs/architecture.md, Log layers), layered as Kafka's storage layer is:

    Segment        one `.log` with its offset and time indexes (segment.py)
    LogSegments    the ordered segments of a log (log_segments.py)
    LocalLog       segments on local disk: append, roll, read, truncate (local_log.py)
    LogLoader      opening a directory: recovery of what follows the recovery point (log_loader.py)
    UnifiedLog     high watermark, log start offset, leader epochs, flush, retention (unified_log.py)
    LogManager     every log of a log directory, its checkpoints and failures (log_manager.py)
    LogCleaner     compaction of cleanup.policy=compact logs on a background thread (log_cleaner.py,
                   over the pure core in segment_format.compaction)

The format of what it writes (batches, segment files, indexes) is the `segment_format` package,
shared with tiered storage and Spark; tiering itself is `broker.remote_log`, above this package
(this package never imports the remote store).

Does file I/O and nothing else: no networking, no asyncio. Methods that fsync, rename or recover
are meant for worker threads; appends and reads are cheap enough for the event loop.
"""
from broker.log.file_cache import FileCache
from broker.log.log_cleaner import LogCleaner
from broker.log.log_manager import LogManager, TopicLogSpec
from broker.log.segment import FetchSlice, Segment
from broker.log.unified_log import AppendInfo, LogDirFailure, UnifiedLog

__all__ = ["AppendInfo", "FetchSlice", "FileCache", "LogCleaner", "LogDirFailure", "LogManager", "Segment", "TopicLogSpec",
           "UnifiedLog"]
