"""The client's public surface as a Kafka user meets it (issue 7, ergonomics)."""
from __future__ import annotations

import inspect

import pytest

from broker.client import Admin, AsyncAdmin


def test_admin_spells_out_every_async_admin_method_with_its_signature():
    """No attribute forwarding: every AsyncAdmin method exists on Admin with the same parameters
    (so help() and IDEs show them), and a misspelt name fails where it is written."""
    public = [name for name, _ in inspect.getmembers(AsyncAdmin, inspect.iscoroutinefunction) if not name.startswith("_")]
    assert public
    for name in public:
        sync = getattr(Admin, name)
        assert not inspect.iscoroutinefunction(sync), name
        assert list(inspect.signature(sync).parameters) == list(inspect.signature(getattr(AsyncAdmin, name)).parameters), name
    with pytest.raises(AttributeError):
        Admin.create_topik  # noqa: B018 - the access itself must fail
