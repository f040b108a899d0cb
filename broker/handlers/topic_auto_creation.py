"""Kafka's `auto.create.topics.enable`: a Metadata request that allows it creates the unknown
topics it names.

Kafka's broker default is true; pymq's is false, because any client may be hostile: a typo in a
producer's topic, or a client that makes up names, must not create topics unless the operator
chose so. Where it is on, each topic is created as a CreateTopics request without a count would
create it (`num.partitions`, `default.replication.factor`, the broker's topic defaults), through
the admin handler, so the same checks hold: the name, internal topics, `max.partitions` (which
bounds every topic a client can ever make), one change at a time. One request creates at most
`auto.create.topics.max.per.request` topics, so that it cannot hold the admin changes for long.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from broker.config import BrokerConfig
from common.errors import PolicyViolationError, PymqError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from protocol import CreateTopicsRequest, CreateTopicsResponse, NewTopic

CreateTopics = Callable[[CreateTopicsRequest], Awaitable[CreateTopicsResponse]]


class TopicAutoCreation:
    """Loop-local: `create_topics` is the admin handler's (its changes lock orders them)."""

    def __init__(self, config: BrokerConfig, create_topics: CreateTopics) -> None:
        self.enabled: bool = config["auto.create.topics.enable"]
        self.max_per_request: int = config["auto.create.topics.max.per.request"]
        self.broker_id: int = config["broker.id"]
        self._create_topics = create_topics

    async def create(self, unknown: Iterable[str]) -> dict[str, PymqError]:
        """Create the `unknown` topics (distinct names) a Metadata request allowed to be created;
        return the error of each one that was not (a topic another request created meanwhile is
        not an error)."""
        names = list(unknown)
        if not self.enabled:
            return {name: UnknownTopicOrPartitionError(
                f"unknown topic {name!r}: auto.create.topics.enable is false on broker {self.broker_id}; "
                f"create the topic first (CreateTopics: Admin.create_topic, `pymq topic create`)") for name in names}
        allowed, refused = names[:self.max_per_request], names[self.max_per_request:]
        errors: dict[str, PymqError] = {name: PolicyViolationError(
            f"topic {name!r} not created: one Metadata request creates at most {self.max_per_request} unknown "
            f"topics (auto.create.topics.max.per.request)") for name in refused}
        response = await self._create_topics(CreateTopicsRequest(tuple(NewTopic(name) for name in allowed)))
        for result in response.topics:
            error = result.error()
            if error is not None and not isinstance(error, TopicAlreadyExistsError):
                errors[result.name] = error
        return errors
