"""ProducerIdManager: cluster-unique producer ids, handed out from blocks (Kafka's ProducerIdManager, KIP-730).

A producer id names one producer instance's sequence space in every partition's producer state,
so two producers must never share one, not even across broker restarts: a reused id would make
one producer's first batch look out of order (or a duplicate) to the other's state. Ids come from
one counter in the metadata store (`producer_ids/next_block`, compare-and-set: etcd for a cluster,
the embedded store's file for a single broker); each broker claims `block_size` ids at a time and
hands them out from memory, so InitProducerId costs a store write once per block. A block a broker
claimed and did not use up is lost when it stops (the id space is 2^63).

Loop-local: call from the event-loop thread only.
"""
from __future__ import annotations

import asyncio
import logging

from broker.cluster.metadata_store import MetadataStore, VersionConflictError

log = logging.getLogger("pymq.producer_ids")

NEXT_BLOCK_KEY = "producer_ids/next_block"
DEFAULT_BLOCK_SIZE = 1000
MAX_CLAIM_ATTEMPTS = 20  # concurrent claims by other brokers each cost one retry


class ProducerIdManager:
    def __init__(self, store: MetadataStore, broker_id: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.store = store
        self.broker_id = broker_id
        self.block_size = block_size
        self._next = 0
        self._end = 0  # the block [_next, _end) is this broker's
        self._claiming = asyncio.Lock()

    async def next_id(self) -> int:
        """A producer id no other call on any broker got or will get. Raises what the metadata
        store raises (MetadataStoreUnavailableError when it cannot be reached)."""
        if self._next >= self._end:
            async with self._claiming:
                if self._next >= self._end:
                    self._next, self._end = await self._claim_block()
        producer_id = self._next
        self._next += 1
        return producer_id

    async def _claim_block(self) -> tuple[int, int]:
        for _ in range(MAX_CLAIM_ATTEMPTS):
            current = await self.store.get(NEXT_BLOCK_KEY)
            start = 0 if current is None else int(current.value["start"])
            try:
                await self.store.put(NEXT_BLOCK_KEY, {"start": start + self.block_size, "broker": self.broker_id},
                                     expected_version=0 if current is None else current.version)
            except VersionConflictError:
                continue  # another broker claimed the block first: take the next
            log.info("broker %d claimed producer ids [%d, %d)", self.broker_id, start, start + self.block_size)
            return start, start + self.block_size
        raise VersionConflictError(f"could not claim a block of producer ids in {MAX_CLAIM_ATTEMPTS} attempts: "
                                   f"{NEXT_BLOCK_KEY} changed under every one")
