"""Fixtures for the remote store's conformance suite: real segments written by the broker's log, and
one RemoteSegmentStore per backend: `file://` in tmp_path, S3 over HTTP (moto's server in a child
process on a free loopback port, reached only through s3fs; stopped by PID at teardown) and
`memory://` for any other fsspec filesystem."""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from segment_format.layout import SegmentFiles
from tests.tiered_storage.backends import MotoServer, make_bucket, s3_options, write_partition
from tiered_storage import RemoteSegmentStore


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3", "memory"])
def store(request, tmp_path) -> Iterator[RemoteSegmentStore]:
    """The store under test, once per backend: the conformance suite runs against each. `memory://`
    stands for "any other fsspec URL" (no directories, no atomic create: the generic code paths)."""
    if request.param == "file":
        yield RemoteSegmentStore.from_url(f"file://{tmp_path / 'remote'}")
    elif request.param == "s3":
        endpoint_url = request.getfixturevalue("moto_server").endpoint_url
        yield RemoteSegmentStore.from_url(f"s3://{make_bucket(endpoint_url)}/pymq", s3_options(endpoint_url))
    else:
        store = RemoteSegmentStore.from_url(f"memory://pymq-{uuid.uuid4().hex}")
        yield store
        with contextlib.suppress(FileNotFoundError):  # the memory filesystem is global to the process
            store.fs.rm(store.root, recursive=True)


@pytest.fixture(scope="session")
def sealed_segments(tmp_path_factory) -> list[SegmentFiles]:
    """The sealed segments of a partition written by the broker's log (all but the active one),
    in offset order. Read-only: tests tamper with remote copies, never with these."""
    directory = write_partition(tmp_path_factory.mktemp("local"))
    bases = sorted(int(path.stem) for path in directory.glob("*.log"))
    assert len(bases) >= 4, bases
    return [SegmentFiles(directory, base) for base in bases[:-1]]
