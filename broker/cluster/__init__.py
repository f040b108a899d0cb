"""Cluster coordination: the metadata store (local or etcd), topics and partition state.

- `metadata_store`: the MetadataStore contract (etcd's model: revisions, txn, watches, leases)
- `local_metadata_store`: the embedded single-file implementation; `metadata_state` is its pure
  state machine, `watch_history` its bounded event history, `clock` its injectable time source
- `topics`: the TopicRegistry, each topic change one store transaction
- `partition`: partition state as the replication layer sees it
- `session_fence`: whether the broker may act on its view of leadership (its session confirmed)
"""
