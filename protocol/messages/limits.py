"""What one request may hold beyond its frame size (`socket.request.max.bytes`): how many elements,
and how long the group fields a coordinator stores and echoes to other members may be.

A frame within the size limit can still hold a million short topic names or partition entries,
and every element costs Python work on the event loop (decoding it, answering it, encoding the
answer): one such request kept every other client waiting for tens of seconds. So before any
per-element work, `RequestMessage.decode` counts the request's elements and refuses one with more
than `request.max.elements` (TooManyElementsError, INVALID_REQUEST on the wire, naming the config).

An element is an item of a list or an entry of a map, at any depth below the control map: a
Metadata request for 1,000 topic names has 1,000; a ListOffsets partition entry
{partition, timestamp, current_leader_epoch} is 1 item of its topic's `partitions` list plus its
3 fields, so 4. The count stops as soon as it passes the limit, so refusing costs O(limit) at most.
The default (500,000) leaves room for the largest legitimate requests: a follower's fetch from
one leader counts 5 per partition it replicates (100,000 partitions), a consumer's ListOffsets 4
per partition; what a request within it costs the loop is bounded by answering in slices
(broker/handlers/slices.py) and the refusal of anything larger.

Group fields (`check_group_strings`, `check_member_bytes`): Kafka carries member ids, group
instance ids, client ids and protocol names as STRINGs (up to 32,767 bytes) and member metadata
and assignments as BYTES bounded only by the request size; the coordinator stores them and sends
them to every member and to anyone who describes the group. pymq bounds them tighter, before the
coordinator sees the request:

- a group instance id follows Kafka's own rule for it (the client's
  `JoinGroupRequest.validateGroupInstanceId`, that of topic names): 1 to 249 characters of
  [a-zA-Z0-9._-], not "." or "..";
- member ids, client ids, protocol types and names: at most GROUP_STRING_MAX_BYTES UTF-8 bytes
  (255, the bound Kafka puts on a JoinGroup/LeaveGroup `reason`). Member ids the coordinator
  makes are the client id or instance id, '-', and a UUID, so they get 37 bytes more;
- a member's protocol metadata (all its protocols together) and an assignment: at most
  `group.member.metadata.max.bytes`. Kafka bounds them by the group record, which must fit
  the offsets topic's message.max.bytes (1 MiB by default) with every member's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidRequestError, TooManyElementsError

GROUP_STRING_MAX_BYTES = 255
GENERATED_MEMBER_ID_EXTRA_BYTES = 37  # '-' and a UUID after the client id or instance id
MEMBER_ID_MAX_BYTES = GROUP_STRING_MAX_BYTES + GENERATED_MEMBER_ID_EXTRA_BYTES
GROUP_INSTANCE_ID_MAX_CHARS = 249  # Kafka's Topic.MAX_NAME_LENGTH, which it applies to instance ids
_LEGAL_INSTANCE_ID = re.compile(r"[a-zA-Z0-9._-]+")

DEFAULT_MAX_ELEMENTS = 500_000
DEFAULT_MEMBER_METADATA_MAX_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The broker's bounds on a request's contents (`request.max.elements`,
    `group.member.metadata.max.bytes`); the defaults are the configs' defaults."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    member_metadata_max_bytes: int = DEFAULT_MEMBER_METADATA_MAX_BYTES

    def check_elements(self, control: dict[str, Any]) -> None:
        """TooManyElementsError if `control` holds more than `max_elements` elements."""
        count = count_elements(control, self.max_elements)
        if count > self.max_elements:
            raise TooManyElementsError(f"the request holds more than {self.max_elements} elements (list items and "
                                       f"map entries; request.max.elements)")

    def check_member_bytes(self, name: str, size: int) -> None:
        """InvalidRequestError if a member's metadata or assignment of `size` bytes is too large."""
        if size > self.member_metadata_max_bytes:
            raise InvalidRequestError(f"{name} of {size} bytes exceeds group.member.metadata.max.bytes "
                                      f"({self.member_metadata_max_bytes})")


def count_elements(control: dict[str, Any], limit: int) -> int:
    """The elements below `control` (list items and map entries at any depth, its own entries not
    counted), or a count past `limit` as soon as one is reached."""
    count, pending = -len(control), [control]
    while pending:
        container = pending.pop()
        count += len(container)
        if count > limit:
            return count
        values = container.values() if container.__class__ is dict else container
        pending.extend([v for v in values if v.__class__ is list or v.__class__ is dict])
    return count


def check_group_string(name: str, value: str | None, max_bytes: int = GROUP_STRING_MAX_BYTES) -> None:
    """InvalidRequestError if a member id, client id or protocol name is longer than `max_bytes`
    UTF-8 bytes (None, an absent optional field, passes)."""
    if value is not None and (len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes):
        raise InvalidRequestError(f"field {name!r} is longer than {max_bytes} UTF-8 bytes")


def check_member_id(name: str, value: str | None) -> None:
    check_group_string(name, value, MEMBER_ID_MAX_BYTES)


def check_group_instance_id(value: str | None) -> None:
    """InvalidRequestError unless `value` is None or a valid group instance id (Kafka's rule)."""
    if value is None:
        return
    if not value or value in (".", "..") or len(value) > GROUP_INSTANCE_ID_MAX_CHARS \
            or _LEGAL_INSTANCE_ID.fullmatch(value) is None:
        raise InvalidRequestError(f"group_instance_id must be 1 to {GROUP_INSTANCE_ID_MAX_CHARS} characters of "
                                  f"[a-zA-Z0-9._-], not '.' or '..' (Kafka's rule)")
