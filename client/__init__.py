"""The lightweight pymq client: Producer, Consumer and Admin, each with an asyncio core.

The public names below load lazily, on first access (PEP 562 module `__getattr__`). This is
not a way around an import cycle (there is none: every module of client imports from the
module that defines a name, never through this package). It keeps the facade from loading
every client when one submodule is wanted: importing `client.decoder` or
`client.range_reader` (what the Spark source's executors need) runs this file first, and
must not load the consumer and producer with their event-loop machinery.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time `__getattr__` loads them
    from client.admin import (
        EARLIEST,
        LATEST,
        Admin,
        AdminError,
        AsyncAdmin,
        GroupDescription,
        GroupListing,
        MemberDescription,
        OffsetAndMetadata,
        PartitionLag,
        TopicDescription,
    )
    from client.consumer import AsyncConsumer, Consumer
    from client.group_membership import GroupMetadata
    from client.decoder import RECORD_SCHEMA, ConsumerRecord
    from client.producer import AsyncProducer, Producer
    from client.producer_batch import RecordFuture, RecordMetadata
    from client.transactions import PreparedTransaction, PreviousTransaction

# Each public name and the module that defines it.
_MODULES = {
    **dict.fromkeys(("EARLIEST", "LATEST", "Admin", "AdminError", "AsyncAdmin", "GroupDescription", "GroupListing",
                     "MemberDescription", "OffsetAndMetadata", "PartitionLag", "TopicDescription"),
                    "client.admin"),
    **dict.fromkeys(("AsyncConsumer", "Consumer"), "client.consumer"),
    "GroupMetadata": "client.group_membership",
    **dict.fromkeys(("RECORD_SCHEMA", "ConsumerRecord"), "client.decoder"),
    **dict.fromkeys(("AsyncProducer", "Producer"), "client.producer"),
    **dict.fromkeys(("RecordFuture", "RecordMetadata"), "client.producer_batch"),
    **dict.fromkeys(("PreparedTransaction", "PreviousTransaction"), "client.transactions"),
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    """Load a public name's module on first access and keep the name here (later accesses are
    plain attribute reads)."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
