"""Metadata and ApiVersions handlers: what this broker serves and speaks."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from inspect import isawaitable

from broker.cluster.brokers import LiveBrokers
from broker.cluster.session_fence import SessionFence
from broker.cluster.topics import NO_LEADER, PartitionState, TopicRegistry
from broker.handlers.slices import answer_in_slices
from broker.handlers.topic_auto_creation import TopicAutoCreation
from common.errors import LeaderNotAvailableError, PymqError
from protocol import (
    SUPPORTED_VERSIONS,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerAddress,
    MetadataRequest,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
    code_and_message,
)


class MetadataHandler:
    """Loop-local: reads the topic registry's in-memory state only; synchronous unless many
    topics are answered in slices.

    While the session fence says this broker's view may be stale (it hung past its session, or
    registered again and has not read the metadata since), the partitions it leads in that view
    are answered LEADER_NOT_AVAILABLE with no leader: it must not tell clients it leads what the
    cluster may have moved (they refresh, from another broker or from this one once it caught up).

    A request that allows topic creation (`allow_auto_topic_creation`) and names topics the
    registry does not know waits for `auto_create` to create them (or to say why not, per topic);
    without `auto_create` they are unknown, as for any other request."""

    def __init__(self, broker_id: int, registry: TopicRegistry, advertised: Callable[[], tuple[str, int]],
                 brokers: LiveBrokers, fence: SessionFence | None = None,
                 auto_create: TopicAutoCreation | None = None) -> None:
        self.broker_id = broker_id
        self.registry = registry
        self.advertised = advertised
        self.brokers = brokers
        self.fence = fence
        self.auto_create = auto_create

    def api_versions(self, request: ApiVersionsRequest) -> ApiVersionsResponse:
        return ApiVersionsResponse(tuple(ApiVersionRange(int(key), key.name, low, high)
                                         for key, (low, high) in SUPPORTED_VERSIONS.items()))

    def metadata(self, request: MetadataRequest) -> MetadataResponse | Awaitable[MetadataResponse]:
        """The brokers and the topics asked for (every topic for None); many topics are answered
        in slices (`answer_in_slices`), the brokers and controller as of the last slice."""
        names = sorted(self.registry.topics) if request.topics is None else request.topics
        if request.topics is not None and request.allow_auto_topic_creation and self.auto_create is not None:
            unknown = [name for name in dict.fromkeys(request.topics) if name not in self.registry.topics]
            if unknown:
                return self._created_then_answered(names, unknown, self.auto_create)
        return answer_in_slices(names, self._topic, self._response)

    async def _created_then_answered(self, names: tuple[str, ...], unknown: list[str],
                                     auto_create: TopicAutoCreation) -> MetadataResponse:
        """The answer once the unknown topics are created: each one that was not answers why."""
        errors = await auto_create.create(unknown)

        def topic(name: str) -> TopicMetadata:
            error = errors.get(name)
            return self._topic(name) if error is None else TopicMetadata(name, *code_and_message(error))

        answer = answer_in_slices(names, topic, self._response)
        return await answer if isawaitable(answer) else answer

    def _response(self, topics: list[TopicMetadata]) -> MetadataResponse:
        host, port = self.advertised()
        brokers = {self.broker_id: BrokerAddress(self.broker_id, host, port)}
        for info in self.brokers.brokers.values():
            brokers.setdefault(info.broker_id, BrokerAddress(info.broker_id, info.host, info.port))
        controller = self.brokers.controller if self.brokers.controller >= 0 else self.broker_id
        return MetadataResponse(tuple(brokers[b] for b in sorted(brokers)), controller, tuple(topics))

    def _topic(self, name: str) -> TopicMetadata:
        try:
            info = self.registry.get(name)
        except PymqError as err:
            return TopicMetadata(name, *code_and_message(err))
        stale = None if self.fence is None else self.fence.reason()  # per topic: slices yield to the loop
        partitions = tuple(self._partition(name, p, s, stale) for p, s in sorted(info.partitions.items()))
        return TopicMetadata(name, topic_id=info.topic_id, partitions=partitions,
                             key_partitioner=self.registry.log_config(name).key_partitioner)

    def _partition(self, topic: str, partition: int, state: PartitionState, stale: str | None) -> PartitionMetadata:
        """One partition as this broker knows it; with no leader while this broker is fenced
        (`stale` says why) and its view has it leading."""
        if stale is not None and state.leader == self.broker_id:
            return PartitionMetadata(partition, NO_LEADER, state.leader_epoch, tuple(state.replicas), tuple(state.isr),
                                     *code_and_message(LeaderNotAvailableError(
                                         f"broker {self.broker_id} does not answer for the leader of {topic}-{partition}: "
                                         f"{stale}")),
                                     target_replicas=state.target_replicas)
        return PartitionMetadata(partition, state.leader, state.leader_epoch, tuple(state.replicas), tuple(state.isr),
                                 target_replicas=state.target_replicas)
