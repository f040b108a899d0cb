"""What the coordinators return: replies to send now, and records to append first.

The group coordinator is a pure state machine (docs/architecture.md, Layers): a request or a timer tick goes in, a
`Result` comes out. `replies` are (token, response) pairs the runtime answers at once; a token is
whatever the runtime handed in with the request (a future), so a JoinGroup parked until the
rebalance completes is answered by a later call's Result. An `Append` asks the runtime to append
records to a partition of `__consumer_offsets` and then to call `complete(error, now_ms)`: the
coordinator changes its state only there, once it knows whether the records are stored, so a
failed append leaves the group as it was, and the Result of `complete` carries the replies that
waited for it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.coordinator.group_records import RecordKey, RecordValue
from common.errors import PymqError
from protocol.messages.base import Message

Reply = tuple[Any, Message]


@dataclass(slots=True)
class Append:
    partition: int
    records: list[tuple[RecordKey, RecordValue]]
    complete: Callable[[PymqError | None, int], "Result"]


@dataclass(slots=True)
class Result:
    replies: list[Reply] = field(default_factory=list)
    appends: list[Append] = field(default_factory=list)

    def add(self, other: "Result") -> "Result":
        self.replies.extend(other.replies)
        self.appends.extend(other.appends)
        return self

    @classmethod
    def reply(cls, token: Any, response: Message) -> "Result":
        return cls([(token, response)])
