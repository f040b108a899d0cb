"""LocalCluster: an etcd and N broker processes on this machine (`pymq cluster start`, tests, benchmarks).

Broker i gets broker.id i, its own log directory under `root`, and its own loopback address
127.0.0.{i+1} (Linux routes all of 127/8 to the loopback interface), so that brokers are told
apart by address as on separate machines and a test can cut one off. Ports are free ones unless
the overrides name them. Every process dies with its parent and is stopped by PID.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.cluster.etcd_process import EtcdProcess
from broker.process import BrokerProcess
from common.child_process import stop_all


def broker_host(broker_id: int) -> str:
    return f"127.0.0.{broker_id + 1}"


class LocalCluster:
    def __init__(self, root: Path, brokers: int = 3, overrides: Mapping[str, Any] | None = None, *,
                 name: str = "local", etcd: EtcdProcess | None = None, config_file: Path | None = None,
                 broker_overrides: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        self.root = Path(root)
        self.name = name
        self.etcd = etcd or EtcdProcess(self.root / "etcd" / "data")
        self._own_etcd = etcd is None
        self.overrides = dict(overrides or {})
        self.broker_overrides = {b: dict(o) for b, o in (broker_overrides or {}).items()}  # one broker's own settings
        self.config_file = config_file
        self.brokers: list[BrokerProcess] = [self._broker(i) for i in range(brokers)]

    def _broker(self, broker_id: int) -> BrokerProcess:
        log_dir = self.root / f"broker-{broker_id}" / "data"
        overrides = {"broker.id": broker_id, "host": broker_host(broker_id), "metadata.store": "etcd",
                     "cluster.name": self.name, **self.overrides, **self.broker_overrides.get(broker_id, {})}
        return BrokerProcess(log_dir, overrides, config_file=self.config_file)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.port is not None)

    def start(self) -> "LocalCluster":
        if self._own_etcd:
            self.etcd.start()
        for broker in self.brokers:
            broker.overrides.setdefault("etcd.endpoint", self.etcd.endpoint)  # unless told the members of another
        try:
            for broker in self.brokers:
                broker.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every broker cleanly, all at once (as long as the slowest takes), then etcd."""
        stop_all(self.brokers)
        if self._own_etcd:
            self.etcd.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
