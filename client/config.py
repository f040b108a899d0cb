"""Client configuration as Kafka users write it.

The synchronous `Producer`, `Consumer` and `Admin` take their settings as Python keywords
(`linger_ms=5`), as Kafka's dotted names (`**{"linger.ms": 5}`), or as one dict, as
confluent-kafka takes it (`Producer({"bootstrap.servers": "host:9092", "linger.ms": 5})`). A dotted
name is the keyword with dots for underscores, except where pymq's keyword is shorter than
Kafka's name (ALIASES). An unknown setting is a ValueError naming it and listing what is accepted,
at construction, instead of a TypeError deep in a constructor or a setting silently ignored; a
Kafka setting pymq has no counterpart for says what pymq does instead (INSTEAD), and one of a
feature still to come says so (NOT_YET_SUPPORTED). Every setting: docs/client-settings.md,
generated from the clients' signatures and client/settings.py.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

BootstrapServers = str | list[str]

RETRY_BACKOFF_MAX_S = 1.0  # Kafka's retry.backoff.max.ms: retry backoffs double up to this

ALIASES = {
    "compression.type": "compression",
    "max.in.flight.requests.per.connection": "max_in_flight",
}

# Kafka settings of features that come with exactly-once delivery: the value that means "off"
# (what pymq does today) is accepted, any other is refused as not yet supported.
NOT_YET_SUPPORTED = {
    "security.protocol": ("PLAINTEXT", "brokers speak plaintext TCP today; TLS and SASL come with security"),
}
# Families of Kafka settings refused whole, and why.
INSTEAD_PREFIXES = {
    "ssl.": "brokers speak plaintext TCP today; TLS and SASL come with security",
    "sasl.": "brokers speak plaintext TCP today; TLS and SASL come with security",
}
# Kafka settings with no pymq counterpart, and what pymq does instead.
INSTEAD = {
    "key.serializer": "pymq sends bytes: encode keys before send(), or send Arrow columns with send_batch()",
    "value.serializer": "pymq sends bytes: encode values before send(), or send Arrow columns with send_batch()",
    "key.deserializer": "pymq returns bytes: decode record.key, or columns of poll_arrow()'s table",
    "value.deserializer": "pymq returns bytes: decode record.value, or columns of poll_arrow()'s table",
    "partitioner.class": "keys are placed by the topic's key.partitioner config (murmur2: Kafka's default "
                         "partitioner); pass partition= to send() to choose one",
    "interceptor.classes": "wrap send() / poll() in your own code, or use on_delivery callbacks",
}

# partition.assignment.strategy as Kafka users write it: class names, short or qualified.
KAFKA_ASSIGNOR_CLASSES = {
    "RangeAssignor": "range",
    "RoundRobinAssignor": "roundrobin",
    "CooperativeStickyAssignor": "cooperative-sticky",
}


def client_settings(factory: Callable[..., Any], bootstrap_servers: BootstrapServers | Mapping[str, Any] | None,
                    config: Mapping[str, Any] | None, keywords: Mapping[str, Any]) -> tuple[BootstrapServers, dict[str, Any]]:
    """(bootstrap servers, keyword arguments for `factory`) from every way a caller may pass them:
    a dict in the first position or in `config`, dotted or Python keyword names. Later sources
    win: the dict, then `config`, then keywords."""
    if isinstance(bootstrap_servers, Mapping):
        config = {**bootstrap_servers, **(config or {})}
        bootstrap_servers = None
    settings: dict[str, Any] = {}
    given: dict[str, str] = {}  # keyword -> the name the caller wrote, for errors
    for source in (config or {}, keywords):
        for name, value in source.items():
            dotted = name.replace("_", ".") if "." not in name else name
            if is_kafka_only(dotted):
                check_kafka_only(dotted, value)
                continue
            keyword = ALIASES.get(name, name.replace(".", "_"))
            settings[keyword], given[keyword] = value, name
    found = settings.pop("bootstrap_servers", None)
    bootstrap = bootstrap_servers if bootstrap_servers is not None else found
    if not bootstrap:
        raise ValueError("bootstrap.servers is required: 'host:port' or a list of them")
    accepted = [name for name, p in inspect.signature(factory).parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(given[name] for name in set(settings) - set(accepted))
    if unknown:
        dotted = {v: k for k, v in ALIASES.items()}
        names = ", ".join(f"{dotted.get(n, n.replace('_', '.'))} ({n})" for n in accepted)
        kind = factory.__qualname__.split(".")[0].removeprefix("Async")
        raise ValueError(f"unknown {kind} setting(s) {', '.join(unknown)}; accepted: {names}")
    return bootstrap, settings


def is_kafka_only(name: str) -> bool:
    """A Kafka setting (dotted name) that pymq answers with `check_kafka_only`, not a setting."""
    return name in NOT_YET_SUPPORTED or name in INSTEAD or name.startswith(tuple(INSTEAD_PREFIXES))


def check_kafka_only(name: str, value: Any) -> None:
    """Accept `value` if it means what pymq does (enable.idempotence=false, ...), else raise a
    ValueError saying what pymq does instead, or that the feature is not yet supported."""
    if name in NOT_YET_SUPPORTED:
        off, why = NOT_YET_SUPPORTED[name]
        given = as_bool(name, value) if isinstance(off, bool) else value
        if given != off and not (isinstance(given, str) and given.lower() == str(off).lower()):
            raise ValueError(f"{name}={value!r} is not yet supported: {why}")
        return
    why = INSTEAD.get(name) or next(why for prefix, why in INSTEAD_PREFIXES.items() if name.startswith(prefix))
    raise ValueError(f"{name} is not a pymq setting: {why}")


def as_bool(name: str, value: Any) -> bool:
    """A boolean setting given as a bool or as the strings "true"/"false" (a properties file's
    values): `bool("false")` would be True."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {value!r}")


def assignor_names(value: str | Sequence[str], known: Collection[str]) -> list[str]:
    """partition.assignment.strategy as a list of pymq assignor names, in preference order, from a
    list or a comma-separated string of pymq names or Kafka's class names
    (`org.apache.kafka.clients.consumer.CooperativeStickyAssignor`)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"partition.assignment.strategy entries must be names, got {item!r}")
        name = item.strip()
        name = KAFKA_ASSIGNOR_CLASSES.get(name.rpartition(".")[2], name)
        if name not in known:
            raise ValueError(f"unknown partition assignment strategy {item.strip()!r}; known: {', '.join(sorted(known))}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("partition.assignment.strategy must name at least one assignor")
    return names
