"""Connection quotas (broker/connection_quotas.py): max.connections, max.connections.per.ip and its
overrides, counted per normalized address; the integration over TCP is in
tests/hostile/test_hostile_connections.py."""
from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.connection_quotas import ConnectionQuotas, parse_overrides
from common.errors import InvalidConfigError


def test_one_address_is_refused_past_its_limit_and_others_still_connect():
    """Two from 10.0.0.1 (limit 2), the third refused naming the config; 10.0.0.2 still admitted."""
    quotas = ConnectionQuotas(max_connections=10, max_per_ip=2)
    assert quotas.try_open("10.0.0.1") is None and quotas.try_open("10.0.0.1") is None
    refused = quotas.try_open("10.0.0.1")
    assert refused is not None and "max.connections.per.ip (2)" in refused
    assert quotas.try_open("10.0.0.2") is None
    assert quotas.open == 3


def test_a_closed_connection_frees_its_slot_and_leaves_no_entry():
    quotas = ConnectionQuotas(max_connections=10, max_per_ip=1)
    assert quotas.try_open("10.0.0.1") is None
    quotas.closed("10.0.0.1")
    assert quotas.open == 0 and not quotas.per_address
    assert quotas.try_open("10.0.0.1") is None


def test_max_connections_bounds_every_address_together():
    quotas = ConnectionQuotas(max_connections=2, max_per_ip=5)
    assert quotas.try_open("10.0.0.1") is None and quotas.try_open("10.0.0.2") is None
    assert quotas.try_open("10.0.0.3") == "max.connections reached"


def test_an_override_raises_or_lowers_one_address_limit():
    quotas = ConnectionQuotas(max_connections=100, max_per_ip=1, overrides=parse_overrides("10.0.0.9:3, 10.0.0.8:0"))
    assert [quotas.try_open("10.0.0.9") for _ in range(4)][3] is not None
    assert quotas.per_address["10.0.0.9"] == 3
    refused = quotas.try_open("10.0.0.8")
    assert refused is not None and "overrides" in refused


@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("127.0.0.1:5", {"127.0.0.1": 5}),
    ("10.0.0.1:1,10.0.0.2:0", {"10.0.0.1": 1, "10.0.0.2": 0}),
    ("::1:7", {"::1": 7}),
    ("[0:0::1]:7", {"::1": 7}),
    ("::ffff:10.0.0.5:3", {"10.0.0.5": 3}),
], ids=["empty", "one", "two", "ipv6-bare", "ipv6-bracketed-normalized", "ipv4-mapped"])
def test_overrides_parse_to_normalized_addresses(text, expected):
    assert parse_overrides(text) == expected


@pytest.mark.parametrize("text", ["10.0.0.1", "10.0.0.1:x", "10.0.0.1:-1", "not-an-address:3", ":3"],
                         ids=["no-count", "count-not-int", "count-negative", "hostname", "no-address"])
def test_bad_overrides_are_a_named_config_error_at_load(text):
    with pytest.raises(InvalidConfigError, match="max.connections.per.ip.overrides"):
        BrokerConfig.from_mapping({"max.connections.per.ip.overrides": text})
