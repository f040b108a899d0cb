"""Client configuration as Kafka users write it.

The synchronous `Producer`, `Consumer` and `Admin` take their settings as Python keywords
(`linger_ms=5`), as Kafka's dotted names (`**{"linger.ms": 5}`), or as one dict, as
confluent-kafka takes it (`Producer({"bootstrap.servers": "host:9092", "linger.ms": 5})`). A dotted
name is the keyword with dots for underscores, except where pymq's keyword is shorter than
Kafka's name (ALIASES). An unknown setting is a ValueError naming it and listing what is accepted,
at construction, instead of a TypeError deep in a constructor or a setting silently ignored.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

BootstrapServers = str | list[str]

ALIASES = {
    "compression.type": "compression",
    "max.in.flight.requests.per.connection": "max_in_flight",
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
