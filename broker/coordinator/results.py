"""What the coordinators return: replies to send now, and records to append first.

A coordinator is a pure state machine (docs/architecture.md, Coordinator): a request or a timer
tick goes in, a `Result` comes out, and the `CoordinatorRuntime` (`runtime.py`) carries it out.
`replies` are (token, response) pairs the runtime answers at once; a token is whatever the
runtime handed in with the request (a future), so a JoinGroup parked until the rebalance
completes is answered by a later call's Result. An `Append` asks the runtime to append records
(the coordinator's own (key, value) types; its `RecordSerde` makes the bytes) to a partition of
the coordinator's internal topic (`__consumer_offsets` for groups) and then to call
`complete(error, now_ms)`: the coordinator changes its state only there, once it knows whether
the records are stored, so a failed append leaves the state as it was, and the Result of
`complete` carries the replies that waited for it. An Append with a `producer` (id, epoch) is
a transactional batch (TxnOffsetCommit: offsets that count once the transaction's commit marker
lands). `effects` are other work the coordinator asks
of its I/O side, as values (the transaction coordinator's markers to write); the runtime hands
them to the effect handler it was given.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.errors import PymqError
from protocol.messages.base import Message

Reply = tuple[Any, Message]
Record = tuple[Any, Any]  # (key, value); a None value is a tombstone
NO_PRODUCER_ID = -1  # the producer id a record of a plain (not transactional) batch replays with


@dataclass(slots=True)
class Append:
    partition: int
    records: list[Record]
    complete: Callable[[PymqError | None, int], "Result"]
    producer: tuple[int, int] | None = None  # (producer id, epoch): a transactional batch


@dataclass(slots=True)
class Result:
    replies: list[Reply] = field(default_factory=list)
    appends: list[Append] = field(default_factory=list)
    effects: list[Any] = field(default_factory=list)

    def add(self, other: "Result") -> "Result":
        self.replies.extend(other.replies)
        self.appends.extend(other.appends)
        self.effects.extend(other.effects)
        return self

    @classmethod
    def reply(cls, token: Any, response: Message) -> "Result":
        return cls([(token, response)])
