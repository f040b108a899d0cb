"""One broker per test module (the Spark session is tests/conftest.py's, one per run): Spark's
start-up costs seconds, so tests share both and use their own topics."""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from broker.process import BrokerProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def source_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker shared by one test module's tests."""
    process = BrokerProcess(tmp_path_factory.mktemp("spark-broker"), {}).start()
    yield process
    process.kill()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return re.sub(r"[^a-zA-Z0-9._-]", "-", f"t{next(_names)}-{request.node.name[:40]}")
