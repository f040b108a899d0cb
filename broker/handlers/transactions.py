"""Producer ids and transactions: InitProducerId.

An idempotent producer's InitProducerId is answered by any broker: a fresh id from the cluster's
allocator (broker/coordinator/producer_ids.py), epoch 0. A producer that must start its sequences
again sends its current id and gets a new one rather than the next epoch of the old: nothing
proves the old id is the caller's, and a fresh id cannot fence anyone else's producer.
"""
from __future__ import annotations

from broker.coordinator.producer_ids import ProducerIdManager
from common.errors import InvalidRequestError, PymqError
from protocol import InitProducerIdRequest, InitProducerIdResponse, code_and_message


class TransactionHandler:
    def __init__(self, producer_ids: ProducerIdManager) -> None:
        self.producer_ids = producer_ids

    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResponse:
        try:
            if request.transactional_id is not None:
                raise InvalidRequestError("transactional producers are not served by this broker version")
            producer_id = await self.producer_ids.next_id()
        except PymqError as err:
            return InitProducerIdResponse(*code_and_message(err))
        return InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)
