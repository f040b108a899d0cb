"""RemoteReadPending: what a fetch below the local log start gets while a worker reads the remote
store (remote_log_reader.py). A module of its own so that the replica manager, which every
broker imports, catches it without importing the reader and with it fsspec, which only brokers
with remote.log.storage.system.enable need."""
from __future__ import annotations


class RemoteReadPending(Exception):
    """The read needs bytes the cache does not hold: a worker is loading them, and `on_ready`
    fires for the partition once the answer waits for the retry. Not an error: the fetch waits."""
