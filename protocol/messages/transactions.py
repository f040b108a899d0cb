"""Producer ids and transactions: InitProducerId (22).

    InitProducerId  request  {transactional_id?, transaction_timeout_ms, producer_id, producer_epoch}
                    response {error_code: 0, result_error_code, result_error_message?, producer_id,
                              producer_epoch}

An idempotent producer (no `transactional_id`) asks any broker for a producer id: a new id from the
cluster's allocator, epoch 0, on every call. `producer_id`/`producer_epoch` are -1 on a first call;
a producer that must start its sequences again (a batch failed for good, or the partition lost its
state) calls again with its current pair and gets a fresh id.

As in `group`, the broker's answer to a well-formed request travels as `result_error_code` beside
the whole-request `error_code` 0.
"""
from __future__ import annotations

from typing import ClassVar

from protocol.framing import ApiKey
from protocol.messages.base import Message, Outcome, RequestMessage
from protocol.messages.group import RESULT_PREFIX
from protocol.schema import INT, NON_NEGATIVE, STR, error_code_field, error_message_field, message, wire

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


@message
class InitProducerIdResponse(Outcome, Message):
    api_key: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    error_code: int = error_code_field(RESULT_PREFIX)
    error_message: str | None = error_message_field(RESULT_PREFIX)
    producer_id: int = wire(INT, NO_PRODUCER_ID)
    producer_epoch: int = wire(INT, NO_PRODUCER_EPOCH)


@message
class InitProducerIdRequest(RequestMessage[InitProducerIdResponse]):
    api_key: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    response_type: ClassVar[type[InitProducerIdResponse]] = InitProducerIdResponse
    transactional_id: str | None = wire(STR, None)
    transaction_timeout_ms: int = wire(INT, 60_000, check=NON_NEGATIVE)
    producer_id: int = wire(INT, NO_PRODUCER_ID)
    producer_epoch: int = wire(INT, NO_PRODUCER_EPOCH)
