"""Cluster coordination: the metadata store (local or etcd), topics and partition state."""
