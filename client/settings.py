"""Every producer, consumer and admin setting, for docs/client-settings.md.

The page is generated from the code so that it cannot drift: names and pymq's defaults come from
the clients' constructor signatures, the Kafka names from `config.ALIASES`, the refused and
not-yet-supported Kafka settings from `config.INSTEAD` and `config.NOT_YET_SUPPORTED`. What this
module adds is what a signature cannot say: each setting's meaning, and Kafka's default beside
pymq's where they differ. A keyword without a meaning here makes `render` fail (a test runs it),
so a new setting cannot reach a release undocumented.

    python -m client.settings > docs/client-settings.md
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from client.admin import AsyncAdmin
from client.config import ALIASES, INSTEAD, INSTEAD_PREFIXES, NOT_YET_SUPPORTED
from client.consumer import AsyncConsumer
from client.producer import COMPRESSION_STAND_INS, AsyncProducer
from client.subscription_state import RESET_ALIASES

# keyword -> (meaning, Kafka's default where it differs from pymq's, else None)
PRODUCER = {
    "acks": ("acknowledgements a send waits for: 0 none, 1 the partition leader, all (-1) every in-sync replica "
             "(None: 1, or all for a transactional producer)", "all"),
    "linger_ms": ("how long a batch that is not full waits for more records before it is sent (a batch also "
                  "waits while the partition has a request in flight)", None),
    "batch_size": ("bytes of records per batch, per partition: a full batch is sent at once", "16384"),
    "compression": ("record batch body compression: none, lz4 or zstd (Arrow IPC buffer compression); Kafka's "
                    f"{', '.join(f'{k} is {v}' for k, v in COMPRESSION_STAND_INS.items())} (logged)", None),
    "max_in_flight": ("unacknowledged Produce requests per broker; 1 keeps each partition's order across "
                      "retries (an idempotent producer keeps it whatever the value)", None),
    "enable_idempotence": ("each batch carries the producer id and a sequence number: a retry after a lost "
                           "response is written once, and each partition keeps its order (None: on unless acks=0)",
                           "true"),
    "transactional_id": ("makes the producer transactional: init_transactions(), begin/commit/abort_transaction(), "
                         "send_offsets_to_transaction(), prepare_transaction(); implies acks=all", "null"),
    "transaction_timeout_ms": ("a transaction open longer is aborted by its coordinator (at most the broker's "
                               "transaction.max.timeout.ms)", None),
    "retries": ("times a retriable failure is retried, within delivery_timeout_ms", None),
    "retry_backoff_ms": ("wait before the first retry; doubles per retry up to retry_backoff_max_ms", None),
    "retry_backoff_max_ms": ("longest wait between retries", None),
    "delivery_timeout_ms": ("longest time from send() to the record's outcome, retries included: then it fails "
                            "with DeliveryTimeoutError", None),
    "request_timeout_ms": ("longest wait for one request's response", None),
    "max_request_size": ("largest Produce request in bytes (and so the largest batch)", "1048576"),
    "buffer_memory": ("bytes of records held unacknowledged before send() blocks", "33554432"),
    "max_block_ms": ("longest send() blocks while buffer_memory is full (or metadata is missing)", None),
    "metadata_max_age_ms": ("metadata is refreshed at least this often (new partitions start receiving keyless "
                            "records)", None),
    "client_id": ("a name for this client: its I/O thread and its log lines", '""'),
}
CONSUMER = {
    "auto_offset_reset": ("where a partition without a committed offset (or with one out of range) starts: "
                          "earliest, latest, none (raise); Kafka's older smallest and largest are accepted",
                          None),
    "fetch_max_wait_ms": ("longest the broker holds a Fetch waiting for fetch_min_bytes", None),
    "fetch_min_bytes": ("bytes a Fetch waits for before it is answered", None),
    "fetch_max_bytes": ("largest Fetch response, over all partitions", None),
    "max_partition_fetch_bytes": ("largest amount one partition contributes to a Fetch response", "1048576"),
    "max_buffer_bytes": ("pymq only: bytes of fetched records buffered ahead of poll() before fetching pauses",
                         "(none)"),
    "check_crcs": ("check every fetched batch's CRC-32C (a corrupt batch is CorruptRecordError)", None),
    "request_timeout_ms": ("longest wait for one request's response", None),
    "retry_backoff_ms": ("wait before retrying a failed fetch, coordinator lookup or commit", None),
    "group_id": ("the consumer group (None: no group; subscribe() and commit() need one)", "null"),
    "group_instance_id": ("static membership (KIP-345): a restart within session_timeout_ms keeps the "
                          "assignment", "null"),
    "client_id": ("a name for this client: its I/O thread, log lines, and group member descriptions", '""'),
    "session_timeout_ms": ("a member without a heartbeat for this long leaves the group", None),
    "heartbeat_interval_ms": ("how often a member heartbeats; below session_timeout_ms", None),
    "max_poll_interval_ms": ("longest time between polls before the member leaves the group; also the "
                             "rebalance timeout", None),
    "partition_assignment_strategy": ("assignors in preference order: range, roundrobin, cooperative-sticky (or "
                                      "Kafka's class names)", None),
    "enable_auto_commit": ("commit positions every auto_commit_interval_ms and when leaving (default: True with "
                           "a group_id)", "true"),
    "auto_commit_interval_ms": ("how often auto-commit commits", None),
    "metadata_max_age_ms": ("metadata is refreshed at least this often (a pattern subscription finds new "
                            "topics)", None),
    "max_poll_records": ("most records one poll() returns (None: all that are fetched), taken from the buffered partitions in turn", "500"),
    "isolation_level": ("read_uncommitted: every record up to the high watermark; read_committed: up to the last "
                        "stable offset, without the records of aborted transactions (transaction markers are never "
                        "returned)", None),
    "allow_auto_create_topics": ("a lookup of a named topic asks the broker to create it if unknown (the broker's "
                                 "auto.create.topics.enable decides); off: a reader's typo creates nothing", "true"),
}
ADMIN = {
    "request_timeout_ms": ("longest wait for one request's response", None),
    "retry_backoff_ms": ("wait before retrying a retriable failure (doubles up to 1 s for reads)", None),
    "default_api_timeout_ms": ("how long reads (metadata, configs, offsets) retry brokers that cannot be reached, "
                               "and group calls their coordinator, before the call fails", None),
    "client_id": ("a name for this client: its I/O thread and its log lines", '""'),
}
CLIENTS: list[tuple[str, Callable[..., Any], dict[str, tuple[str, str | None]]]] = [
    ("Producer", AsyncProducer.__init__, PRODUCER),
    ("Consumer", AsyncConsumer.__init__, CONSUMER),
    ("Admin", AsyncAdmin.__init__, ADMIN),
]


def kafka_name(keyword: str) -> str:
    dotted = {v: k for k, v in ALIASES.items()}
    return dotted.get(keyword, keyword.replace("_", "."))


def _default(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(value)
    return "None" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def render() -> str:
    """docs/client-settings.md. ValueError when a setting of a client has no meaning here, or a
    meaning names a setting the client no longer has."""
    out = ["# Client settings", "",
           "Every setting of `Producer`, `Consumer` and `Admin` (and their `Async` cores), generated from the code",
           "(`python -m client.settings`, client/settings.py). A setting is given as a Python keyword",
           "(`linger_ms=5`), as Kafka's dotted name (`**{\"linger.ms\": 5}`), or in one dict with `bootstrap.servers`",
           "as confluent-kafka takes it. An unknown name is an error that lists the accepted ones.", ""]
    for name, factory, meanings in CLIENTS:
        keywords = {n: p.default for n, p in inspect.signature(factory).parameters.items() if p.kind is p.KEYWORD_ONLY}
        if set(keywords) != set(meanings):
            raise ValueError(f"{name}: settings without a meaning {sorted(set(keywords) - set(meanings))}, "
                             f"meanings without a setting {sorted(set(meanings) - set(keywords))}")
        out += [f"## {name}", "", "| Kafka name | keyword | default | Kafka's default | meaning |",
                "| --- | --- | --- | --- | --- |"]
        for keyword, default in keywords.items():
            meaning, kafka_default = meanings[keyword]
            out.append(f"| `{kafka_name(keyword)}` | `{keyword}` | `{_default(default)}` | "
                       f"{'same' if kafka_default is None else f'`{kafka_default}`'} | {meaning} |")
        out.append("")
    out += ["## Kafka settings that pymq answers differently", "",
            "| Kafka name | what happens |", "| --- | --- |"]
    for kafka, (off, why) in NOT_YET_SUPPORTED.items():
        accepted = "no value" if off is None else f"`{_default(off)}`"
        out.append(f"| `{kafka}` | {accepted} is accepted (what pymq does); any other value: not yet supported, "
                   f"{why} |")
    for kafka, instead in INSTEAD.items():
        out.append(f"| `{kafka}` | refused: {instead} |")
    for prefix, instead in INSTEAD_PREFIXES.items():
        out.append(f"| `{prefix}*` | refused: {instead} |")
    aliases = ", ".join(f"`{k}` is `{v}`" for k, v in RESET_ALIASES.items())
    stand_ins = ", ".join(f"`{k}` is `{v}`" for k, v in COMPRESSION_STAND_INS.items())
    out += ["", f"Values: `auto.offset.reset` {aliases}; `compression.type` {stand_ins}.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
