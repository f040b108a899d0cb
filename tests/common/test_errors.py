"""Error taxonomy (common/errors.py): one class per wire code, names, and code <-> class round trips."""
from __future__ import annotations

import pytest

import common.errors as errors
from common.errors import (
    CorruptMessageError,
    InvalidRequestError,
    PymqError,
    UnknownServerError,
    error_for_code,
    error_name,
)


def _all_error_classes() -> list[type[PymqError]]:
    found, todo = [], [PymqError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__ == errors.__name__:
                found.append(sub)
                todo.append(sub)
    return found


ALL_CLASSES = _all_error_classes()
ERROR_CLASSES = [cls for cls in ALL_CLASSES if "_wire_name" in cls.__dict__]  # registered: one per wire code


def test_every_unregistered_error_class_is_a_finer_kind_of_a_registered_one():
    """A class without a wire name of its own answers with a registered base's code."""
    for cls in set(ALL_CLASSES) - set(ERROR_CLASSES):
        assert error_for_code(cls.code).__class__ in cls.__mro__, cls


def test_every_error_class_has_a_unique_code():
    """No two error classes share a wire code, and none uses 0 (reserved for NONE)."""
    codes = [cls.code for cls in ERROR_CLASSES]
    assert len(codes) == len(set(codes))
    assert 0 not in codes


def test_every_error_class_has_a_unique_upper_snake_name():
    """Each class has its own wire name in UPPER_SNAKE_CASE, not the Python class-name fallback."""
    names = [cls.name() for cls in ERROR_CLASSES]
    assert len(names) == len(set(names))
    for cls, name in zip(ERROR_CLASSES, names):
        assert name != cls.__name__ and name.replace("_", "").isalpha() and name.isupper(), cls


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_for_code_round_trips_each_class(cls):
    """error_for_code(cls.code) is an instance of exactly cls, and error_name gives cls.name()."""
    err = error_for_code(cls.code, "details")
    assert type(err) is cls
    assert str(err) == "details"
    assert error_name(cls.code) == cls.name()


def test_error_for_code_defaults_the_message_to_the_name():
    """Without a message the exception text is the wire name."""
    assert str(error_for_code(CorruptMessageError.code)) == "CORRUPT_MESSAGE"


@pytest.mark.parametrize("code", [9999, -2, 11, 2**31 - 1], ids=["large", "negative", "gap", "int32_max"])
def test_unknown_code_maps_to_unknown_server_error(code):
    """A code with no class becomes UnknownServerError, named UNKNOWN_SERVER_ERROR."""
    err = error_for_code(code)
    assert type(err) is UnknownServerError
    assert error_name(code) == "UNKNOWN_SERVER_ERROR"


def test_code_zero_is_named_none():
    """error_name(0) is 'NONE': success on the wire is not an error."""
    assert error_name(0) == "NONE"
    assert errors.NONE == 0


@pytest.mark.parametrize(
    "code, name",
    [(2, "CORRUPT_MESSAGE"), (3, "UNKNOWN_TOPIC_OR_PARTITION"), (1, "OFFSET_OUT_OF_RANGE"), (6, "NOT_LEADER"),
     (10, "MESSAGE_TOO_LARGE"), (19, "NOT_ENOUGH_REPLICAS"), (22, "ILLEGAL_GENERATION"), (27, "REBALANCE_IN_PROGRESS"),
     (42, "INVALID_REQUEST"), (45, "OUT_OF_ORDER_SEQUENCE")],
    ids=lambda v: str(v),
)
def test_design_error_codes_keep_their_kafka_numbers(code, name):
    """The codes docs/architecture.md (Wire protocol) names keep Kafka's numbers, so Kafka readers recognise them."""
    assert error_name(code) == name


def test_errors_are_pymq_errors_and_carry_retriable():
    """Every class is a PymqError with a boolean retriable flag; e.g. NOT_LEADER retries, INVALID_REQUEST does not."""
    for cls in ERROR_CLASSES:
        assert issubclass(cls, PymqError) and isinstance(cls.retriable, bool)
    assert error_for_code(6).retriable is True
    assert InvalidRequestError.retriable is False


GROUP_CODES = [
    # code, wire name, retriable (as Kafka has it)
    (12, "OFFSET_METADATA_TOO_LARGE", False), (14, "COORDINATOR_LOAD_IN_PROGRESS", True),
    (15, "COORDINATOR_NOT_AVAILABLE", True), (16, "NOT_COORDINATOR", True), (22, "ILLEGAL_GENERATION", False),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False), (24, "INVALID_GROUP_ID", False), (25, "UNKNOWN_MEMBER_ID", False),
    (26, "INVALID_SESSION_TIMEOUT", False), (27, "REBALANCE_IN_PROGRESS", True), (68, "NON_EMPTY_GROUP", False),
    (69, "GROUP_ID_NOT_FOUND", False), (79, "MEMBER_ID_REQUIRED", False), (81, "GROUP_MAX_SIZE_REACHED", False),
    (82, "FENCED_INSTANCE_ID", False), (86, "GROUP_SUBSCRIBED_TO_TOPIC", False), (901, "PARTITION_NOT_ASSIGNED", False),
]


@pytest.mark.parametrize("code, name, retriable", GROUP_CODES, ids=[c[1] for c in GROUP_CODES])
def test_group_coordinator_codes_keep_their_kafka_numbers_and_retriability(code, name, retriable):
    """The group coordinator's codes carry Kafka's numbers and names (pymq's own in 900..999), and
    only the coordinator lookups (and a rebalance) are retried."""
    err = error_for_code(code)
    assert error_name(code) == name and type(err).name() == name
    assert err.retriable is retriable


def test_a_class_registers_its_wire_name_and_a_second_class_cannot_claim_the_same_code() -> None:
    """The wire name lives on the class; two registered classes for one code fail at definition."""
    assert errors.error_for_code(errors.CorruptMessageError.code).name() == "CORRUPT_MESSAGE"
    with pytest.raises(TypeError, match="both claim wire code 2"):
        class _Twin(errors.PymqError, wire_name="TWIN"):
            code = errors.CorruptMessageError.code
    assert errors.error_for_code(2).__class__ is errors.CorruptMessageError


def test_an_unregistered_subclass_keeps_its_class_name_and_its_base_code() -> None:
    """A finer kind of a registered error (no wire name) is named by its class, answered by its base's code."""
    class FinerStorageError(errors.KafkaStorageError):
        pass

    assert FinerStorageError.name() == "FinerStorageError"
    assert errors.error_for_code(FinerStorageError.code).__class__ is errors.KafkaStorageError
