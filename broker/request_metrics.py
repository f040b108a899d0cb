"""Request metrics per API, with Kafka's RequestMetrics split of a request's time.

    queue          from the request's bytes being read off the socket to its handler starting
                   (requests read together wait for the ones before them)
    local          the handler's own work, including what it awaits (a log append and, for
                   flush-on-ack topics, its fsync)
    remote         parked in a purgatory: a produce waiting for acks=all, a fetch waiting for
                   fetch.min.bytes or a remote read, a JoinGroup waiting for the rebalance
    response_send  from the response being ready to its last byte handed to the kernel (with
                   sendfile: sent), including waiting behind earlier responses of the connection
    total          the sum: what the client sees, less the network

plus requests and errors (every error code a response carries, its own and its topics',
partitions' and groups', by name, as Kafka's ErrorsPerSec) per API. One
`RequestTimer` per request carries the timestamps; `RequestMetrics.record` files them.

`TopicTraffic` counts per topic, as Kafka's BrokerTopicMetrics: bytes and messages appended by
produces (BytesInPerSec, MessagesInPerSec; acknowledged appends only), and record bytes sent in
fetch responses (BytesOutPerSec). All on the event loop; the collector (broker/metrics.py) reads
the counts at scrape time.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.histogram import Histogram
from common.errors import error_for_code
from protocol import ApiKey

PHASES = ("queue", "local", "remote", "response_send", "total")


@dataclass
class ApiMetrics:
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error name -> responses carrying it
    phases: tuple[Histogram, ...] = field(default_factory=lambda: tuple(Histogram() for _ in PHASES))


class RequestTimer:
    """The timestamps (event loop clock) of one request."""

    __slots__ = ("api_key", "received", "started", "local_done", "remote_done")

    def __init__(self, api_key: int, received: float, started: float) -> None:
        self.api_key = api_key
        self.received = received
        self.started = started
        self.local_done = started  # until the handler returns
        self.remote_done = -1.0  # set when a parked request completes


class RequestMetrics:
    def __init__(self) -> None:
        self.by_api: dict[int, ApiMetrics] = {}  # by api key; named at scrape time (`named`)

    def record(self, timer: RequestTimer, control: dict[str, Any] | None, sent: float) -> None:
        """File a request whose response (None: none is sent, acks=0) was handed over at `sent`.
        On the event loop for every request: ~3 us, so written flat."""
        metrics = self.by_api.get(timer.api_key)
        if metrics is None:
            metrics = self.by_api[timer.api_key] = ApiMetrics()
        metrics.requests += 1
        local_done = timer.local_done
        remote_done = timer.remote_done if timer.remote_done >= 0 else local_done
        queue, local = timer.started - timer.received, local_done - timer.started
        remote, send = remote_done - local_done, max(0.0, sent - remote_done)
        phases = metrics.phases
        phases[0].observe(queue)
        phases[1].observe(local)
        phases[2].observe(remote)
        phases[3].observe(send)
        phases[4].observe(queue + local + remote + send)
        if control:
            for code in _error_codes(control):
                error = _error_name(code)
                metrics.errors[error] = metrics.errors.get(error, 0) + 1

    def named(self) -> dict[str, ApiMetrics]:
        """The metrics by API name (`produce`, `join_group`, ...), for a scrape."""
        return {_api_name(key): metrics for key, metrics in list(self.by_api.items())}


_API_NAMES = {int(key): key.name.lower() for key in ApiKey}
_ERROR_NAMES: dict[int, str] = {}


def _api_name(api_key: int) -> str:
    return _API_NAMES.get(api_key, "unknown")


def _error_codes(control: dict[str, Any]) -> Iterator[Any]:
    """Every non-zero error code of a response, as Kafka's errorCounts: the request's, and each
    topic's, partition's and group's (a produce to 3 partitions of which 2 fail counts 2)."""
    for key in ("error_code", "result_error_code"):
        if control.get(key):
            yield control[key]
    for entries in (control.get("topics"), control.get("groups"), control.get("results")):
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            if entry.get("error_code"):
                yield entry["error_code"]
            for partition in entry.get("partitions") or ():
                if isinstance(partition, dict) and partition.get("error_code"):
                    yield partition["error_code"]


def _error_name(code: Any) -> str:
    name = _ERROR_NAMES.get(code)
    if name is None:
        name = _ERROR_NAMES[code] = error_for_code(code, None).name() if isinstance(code, int) else "UNKNOWN"
    return name


class TopicTraffic:
    def __init__(self) -> None:
        self.bytes_in: dict[str, int] = {}
        self.messages_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}

    def appended(self, topic: str, size: int, records: int) -> None:
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + size
        self.messages_in[topic] = self.messages_in.get(topic, 0) + records

    def sent(self, topic: str, size: int) -> None:
        if size:
            self.bytes_out[topic] = self.bytes_out.get(topic, 0) + size
