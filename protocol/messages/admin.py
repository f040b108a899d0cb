"""Admin APIs: CreateTopics (19), DeleteTopics (20), DescribeConfigs (32), AlterConfigs (33),
CreatePartitions (37). Each answers per topic, in request order.

    CreateTopics      request  {validate_only, topics: [{name, num_partitions, replication_factor, configs}]}
    DeleteTopics      request  {topics: [name]}
    CreatePartitions  request  {validate_only, topics: [{name, count}]}
    DescribeConfigs   request  {topics: [name]}
                      response {error_code, topics: [{name, error_code, error_message?,
                                configs: [{name, value, source}]}]}
    AlterConfigs      request  {validate_only, topics: [{name, set: {key: value}, delete: [key]}]}
    the others        response {error_code, topics: [{name, error_code, error_message?}]}

A topic entry whose own fields are malformed (a name that is not a string, a count that is not an
int, a config value that is a map) keeps the error on the entry and is answered alone with it;
the other topics of the request go on. `num_partitions` / `replication_factor` -1 mean the
broker's default. Config values are strings or numbers; whether they are valid is the topic
registry's call (INVALID_CONFIG).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

from common.errors import InvalidConfigError, InvalidRequestError, InvalidTopicError, PymqError
from protocol.fields import field, string_keys
from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, RequestMessage, entry_error
from protocol.schema import (
    BOOL,
    INT,
    STR,
    Entries,
    Kind,
    Scalar,
    REQUIRED,
    Seq,
    error_code_field,
    error_message_field,
    message,
    wire,
)

ConfigValue = Union[str, int, float]


class Configs(Kind):
    """A config map of a topic entry: string keys to strings or numbers."""

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        configs = field(control, key, dict, None)
        if configs is None:
            return {}  # a map of its own: callers may fill it
        error = string_keys(configs, key)
        if error is not None:
            raise error
        for name, value in configs.items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise InvalidConfigError(f"config {name!r} must be a string or a number, got {type(value).__name__}")
        return configs


class TopicName(Scalar):
    """A topic name to create: one that is no string breaks the naming rules (INVALID_TOPIC)."""

    def __init__(self) -> None:
        super().__init__(str)

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        try:
            return field(control, key, str, absent)
        except InvalidRequestError as err:
            raise InvalidTopicError(f"topic name must be a string: {err}") from None


class TopicNames(Kind):
    """A list of bare topic names (`TopicRef`s), each one's type checked on its own."""

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[t.name for t in {v}]"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        return tuple(TopicRef(name) if isinstance(name, str) else
                     TopicRef("", InvalidRequestError(f"topic names must be strings, got {type(name).__name__}"))
                     for name in field(control, key, list))


# -- responses ---------------------------------------------------------------------------------


@message
class TopicResult(Outcome):
    name: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()


@message
class CreateTopicsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_TOPICS
    topics: tuple[TopicResult, ...] = wire(Entries(TopicResult))


@message
class DeleteTopicsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_TOPICS
    topics: tuple[TopicResult, ...] = wire(Entries(TopicResult))


@message
class CreatePartitionsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    topics: tuple[TopicResult, ...] = wire(Entries(TopicResult))


@message
class AlterConfigsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS
    topics: tuple[TopicResult, ...] = wire(Entries(TopicResult))


@message
class ConfigEntry:
    """One effective config; `source` is "topic" (an override) or "broker_default"."""

    name: str = wire(STR)
    value: ConfigValue = wire(Scalar((str, int, float)))
    source: str = wire(STR)


@message
class TopicConfigs(Outcome):
    errors_last: ClassVar[bool] = True
    name: str = wire(STR)
    error_code: int = error_code_field()
    error_message: str | None = error_message_field()
    configs: tuple[ConfigEntry, ...] = wire(Entries(ConfigEntry), (), absent=REQUIRED)


@message
class DescribeConfigsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    topics: tuple[TopicConfigs, ...] = wire(Entries(TopicConfigs))


# -- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A topic named by a request that lists bare names; `error` when the name is not a string."""

    name: str
    error: PymqError | None = entry_error()


@message
class NewTopic:
    """`num_partitions` / `replication_factor` -1: the broker's default."""

    name: str = wire(TopicName(), entry=True, placeholder="")
    num_partitions: int = wire(INT, -1, entry=True)
    replication_factor: int = wire(INT, -1, entry=True)
    configs: dict[str, ConfigValue] = wire(Configs(), default_factory=dict, entry=True)
    error: PymqError | None = entry_error()


@message
class CreateTopicsRequest(RequestMessage[CreateTopicsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_TOPICS
    response_type: ClassVar[type[CreateTopicsResponse]] = CreateTopicsResponse
    wire_order: ClassVar[tuple[str, ...]] = ("validate_only", "topics")
    topics: tuple[NewTopic, ...] = wire(Entries(NewTopic))
    validate_only: bool = wire(BOOL, False)


@message
class DeleteTopicsRequest(RequestMessage[DeleteTopicsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_TOPICS
    response_type: ClassVar[type[DeleteTopicsResponse]] = DeleteTopicsResponse
    topics: tuple[TopicRef, ...] = wire(TopicNames())


@message
class PartitionCount:
    """Grow topic `name` to `count` partitions."""

    name: str = wire(STR, entry=True, placeholder="")
    count: int = wire(INT, entry=True, placeholder=-1)
    error: PymqError | None = entry_error()


@message
class CreatePartitionsRequest(RequestMessage[CreatePartitionsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    response_type: ClassVar[type[CreatePartitionsResponse]] = CreatePartitionsResponse
    wire_order: ClassVar[tuple[str, ...]] = ("validate_only", "topics")
    topics: tuple[PartitionCount, ...] = wire(Entries(PartitionCount))
    validate_only: bool = wire(BOOL, False)


@message
class DescribeConfigsRequest(RequestMessage[DescribeConfigsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    response_type: ClassVar[type[DescribeConfigsResponse]] = DescribeConfigsResponse
    topics: tuple[TopicRef, ...] = wire(TopicNames())


@message
class ConfigChange:
    """Incremental, like Kafka's IncrementalAlterConfigs: set some configs of topic `name`, reset
    the `delete`d ones to the broker default."""

    name: str = wire(STR, entry=True, placeholder="")
    set_configs: dict[str, ConfigValue] = wire(Configs(), key="set", default_factory=dict, entry=True)
    delete: tuple[str, ...] = wire(Seq(str, "config names to reset must be strings"), (), entry=True)
    error: PymqError | None = entry_error()


@message
class AlterConfigsRequest(RequestMessage[AlterConfigsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS
    response_type: ClassVar[type[AlterConfigsResponse]] = AlterConfigsResponse
    wire_order: ClassVar[tuple[str, ...]] = ("validate_only", "topics")
    topics: tuple[ConfigChange, ...] = wire(Entries(ConfigChange))
    validate_only: bool = wire(BOOL, False)
