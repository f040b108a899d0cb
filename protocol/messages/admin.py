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
from dataclasses import field as dataclass_field
from typing import Any, ClassVar, Union

from common.errors import InvalidConfigError, InvalidRequestError, InvalidTopicError, PymqError
from protocol.fields import entries, entry_field, field, string_keys
from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, RequestMessage, decode_error, entry_error, put_error

ConfigValue = Union[str, int, float]


def _configs(item: dict[str, Any], name: str) -> tuple[dict[str, ConfigValue], PymqError | None]:
    """A config map of a topic entry: a map of string keys to scalar values, else the entry's error."""
    configs, error = entry_field(item, name, dict, {}, {})
    error = error or string_keys(configs, name)
    if error is not None:
        return {}, error
    for key, value in configs.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            return {}, InvalidConfigError(f"config {key!r} must be a string or a number, got {type(value).__name__}")
    return configs, None


def _names(control: dict[str, Any]) -> tuple["TopicRef", ...]:
    """A list of topic names, each one's type checked on its own."""
    refs = []
    for name in field(control, "topics", list):
        if isinstance(name, str):
            refs.append(TopicRef(name))
        else:
            refs.append(TopicRef("", InvalidRequestError(f"topic names must be strings, got {type(name).__name__}")))
    return tuple(refs)


# -- responses ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicResult(Outcome):
    name: str
    error_code: int = 0
    error_message: str | None = None

    def to_control(self) -> dict[str, Any]:
        return put_error({"name": self.name}, self.error_code, self.error_message)

    @classmethod
    def from_control(cls, control: dict[str, Any]) -> "TopicResult":
        return cls(field(control, "name", str), *decode_error(control))


class TopicResults(Message):
    """Responses that are one TopicResult per topic of the request."""

    __slots__ = ()
    topics: tuple[TopicResult, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": 0, "topics": [t.to_control() for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> Any:
        return cls(tuple(TopicResult.from_control(t) for t in entries(control, "topics")))  # type: ignore[call-arg]


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse(TopicResults):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_TOPICS
    topics: tuple[TopicResult, ...]


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(TopicResults):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_TOPICS
    topics: tuple[TopicResult, ...]


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse(TopicResults):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    topics: tuple[TopicResult, ...]


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse(TopicResults):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS
    topics: tuple[TopicResult, ...]


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One effective config; `source` is "topic" (an override) or "broker_default"."""

    name: str
    value: ConfigValue
    source: str


@dataclass(frozen=True, slots=True)
class TopicConfigs(Outcome):
    name: str
    error_code: int = 0
    error_message: str | None = None
    configs: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Message):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    topics: tuple[TopicConfigs, ...]

    def to_control(self) -> dict[str, Any]:
        return {"error_code": 0, "topics": [
            put_error({"name": t.name, "configs": [{"name": c.name, "value": c.value, "source": c.source} for c in t.configs]},
                      t.error_code, t.error_message)
            for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeConfigsResponse":
        return cls(tuple(
            TopicConfigs(field(t, "name", str), *decode_error(t), tuple(
                ConfigEntry(field(c, "name", str), field(c, "value", (str, int, float)), field(c, "source", str))
                for c in entries(t, "configs")))
            for t in entries(control, "topics")))


# -- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A topic named by a request that lists bare names; `error` when the name is not a string."""

    name: str
    error: PymqError | None = entry_error()


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, ConfigValue] = dataclass_field(default_factory=dict)
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"name": self.name, "num_partitions": self.num_partitions,
                "replication_factor": self.replication_factor, "configs": self.configs}

    @classmethod
    def from_control(cls, item: dict[str, Any]) -> "NewTopic":
        name, name_error = entry_field(item, "name", str, "")
        if name_error is not None:  # a topic name that is no string breaks the naming rules
            name_error = InvalidTopicError(f"topic name must be a string: {name_error}")
        partitions, partitions_error = entry_field(item, "num_partitions", int, -1, -1)
        replication, replication_error = entry_field(item, "replication_factor", int, -1, -1)
        configs, configs_error = _configs(item, "configs")
        return cls(name, partitions, replication, configs, name_error or partitions_error or replication_error or configs_error)


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest(RequestMessage[CreateTopicsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_TOPICS
    response_type: ClassVar[type[CreateTopicsResponse]] = CreateTopicsResponse
    topics: tuple[NewTopic, ...]
    validate_only: bool = False

    def to_control(self) -> dict[str, Any]:
        return {"validate_only": self.validate_only, "topics": [t.to_control() for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "CreateTopicsRequest":
        validate_only = field(control, "validate_only", bool, False)
        return cls(tuple(NewTopic.from_control(t) for t in entries(control, "topics")), validate_only)


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest(RequestMessage[DeleteTopicsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DELETE_TOPICS
    response_type: ClassVar[type[DeleteTopicsResponse]] = DeleteTopicsResponse
    topics: tuple[TopicRef, ...]

    def to_control(self) -> dict[str, Any]:
        return {"topics": [t.name for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DeleteTopicsRequest":
        return cls(_names(control))


@dataclass(frozen=True, slots=True)
class PartitionCount:
    """Grow topic `name` to `count` partitions."""

    name: str
    count: int
    error: PymqError | None = entry_error()

    @classmethod
    def from_control(cls, item: dict[str, Any]) -> "PartitionCount":
        name, name_error = entry_field(item, "name", str, "")
        count, count_error = entry_field(item, "count", int, -1)
        return cls(name, count, name_error or count_error)


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest(RequestMessage[CreatePartitionsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    response_type: ClassVar[type[CreatePartitionsResponse]] = CreatePartitionsResponse
    topics: tuple[PartitionCount, ...]
    validate_only: bool = False

    def to_control(self) -> dict[str, Any]:
        return {"validate_only": self.validate_only, "topics": [{"name": t.name, "count": t.count} for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "CreatePartitionsRequest":
        validate_only = field(control, "validate_only", bool, False)
        return cls(tuple(PartitionCount.from_control(t) for t in entries(control, "topics")), validate_only)


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest(RequestMessage[DescribeConfigsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.DESCRIBE_CONFIGS
    response_type: ClassVar[type[DescribeConfigsResponse]] = DescribeConfigsResponse
    topics: tuple[TopicRef, ...]

    def to_control(self) -> dict[str, Any]:
        return {"topics": [t.name for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "DescribeConfigsRequest":
        return cls(_names(control))


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """Incremental, like Kafka's IncrementalAlterConfigs: set some configs of topic `name`, reset
    the `delete`d ones to the broker default."""

    name: str
    set_configs: dict[str, ConfigValue] = dataclass_field(default_factory=dict)
    delete: tuple[str, ...] = ()
    error: PymqError | None = entry_error()

    def to_control(self) -> dict[str, Any]:
        return {"name": self.name, "set": self.set_configs, "delete": list(self.delete)}

    @classmethod
    def from_control(cls, item: dict[str, Any]) -> "ConfigChange":
        name, name_error = entry_field(item, "name", str, "")
        set_configs, set_error = _configs(item, "set")
        delete, delete_error = entry_field(item, "delete", list, [], [])
        if delete_error is None and not all(isinstance(key, str) for key in delete):
            delete, delete_error = [], InvalidRequestError("config names to reset must be strings")
        return cls(name, set_configs, tuple(delete), name_error or set_error or delete_error)


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest(RequestMessage[AlterConfigsResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.ALTER_CONFIGS
    response_type: ClassVar[type[AlterConfigsResponse]] = AlterConfigsResponse
    topics: tuple[ConfigChange, ...]
    validate_only: bool = False

    def to_control(self) -> dict[str, Any]:
        return {"validate_only": self.validate_only, "topics": [t.to_control() for t in self.topics]}

    @classmethod
    def from_control(cls, control: dict[str, Any], payload: memoryview) -> "AlterConfigsRequest":
        validate_only = field(control, "validate_only", bool, False)
        return cls(tuple(ConfigChange.from_control(t) for t in entries(control, "topics")), validate_only)
