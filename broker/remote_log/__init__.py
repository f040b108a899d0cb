"""Tiering of a broker's logs (Kafka's RemoteLogManager and remote reads): the layer between the
local log (broker.log) and the remote segment store (tiered_storage), so that neither of those
imports the other.

    RemoteLogManager  uploads sealed segments, commits the manifest, expires remote segments
                      (remote_log_manager.py; imported where used: it pulls in fsspec, and only
                      brokers with remote.log.storage.system.enable need it)
    RemoteLogReader   serves fetches and time lookups below the local log start from the store
                      through a bounded chunk cache (remote_log_reader.py; it pulls in fsspec too)
    RemoteReadPending what a fetch gets while a worker reads the store (remote_read_pending.py:
                      the replica manager catches it in every broker, tiering or not)
    describe_partition  a tiered partition's local and remote ranges and upload lag (tiering_status.py)
"""
