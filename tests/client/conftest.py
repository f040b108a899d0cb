"""Fixtures for the client tests: one real broker process per test module, and fresh topics on it.

Tests that stop, kill or restart a broker use the function-scoped `broker_factory` from
tests/conftest.py instead, so they never disturb the shared one.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator

import pytest

from client import Admin, Consumer
from broker.process import BrokerProcess

_topic_ids = itertools.count()


@pytest.fixture(scope="module")
def shared_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One broker for the module's tests that do not stop it, with the module's `BROKER_OVERRIDES`
    (a dict of broker config keys), if any. Killed by PID at module teardown."""
    overrides = getattr(request.module, "BROKER_OVERRIDES", {})
    log_dir = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]) / "broker"
    process = BrokerProcess(log_dir, overrides).start()
    yield process
    process.kill()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A legal topic name derived from the test's name, unique within the session."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:200] + f"-{next(_topic_ids)}"


@pytest.fixture
def new_topic(shared_broker, topic_name: str) -> Callable[..., str]:
    """Create a fresh topic on the shared broker (a new name on every call) and return its name."""

    def make(partitions: int = 1, configs: dict[str, object] | None = None) -> str:
        name = f"{topic_name}-{next(_topic_ids)}"
        with Admin(shared_broker.bootstrap) as admin:
            admin.create_topic(name, partitions=partitions, configs=configs)
        return name

    return make


@pytest.fixture
def consumers() -> Iterator[Callable[..., Consumer]]:
    """Make consumers (fast long polls); every one is closed at teardown."""
    made: list[Consumer] = []

    def make(bootstrap: str, **config: object) -> Consumer:
        consumer = Consumer(bootstrap, **{"fetch_max_wait_ms": 100, **config})
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()
