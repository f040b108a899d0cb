"""The errors of the remote segment store and its manifests.

Every failure of the object store (connection refused, timeout, throttling, a 5xx, a permission
error, a missing object) surfaces as a RemoteStorageError: botocore, aiohttp and OSError
exceptions never leak out of `tiered_storage`. On the wire they are KAFKA_STORAGE_ERROR (code 56,
retriable), but they deliberately do not subclass KafkaStorageError: the broker's log layer
takes a local log directory offline on a KafkaStorageError, and an object store outage must never
do that. Bad bytes read back from the store are a CorruptMessageError (CORRUPT_MESSAGE).
"""
from __future__ import annotations

from common.errors import KafkaStorageError, PymqError


class RemoteStorageError(PymqError):
    """An operation on the remote store failed (outage, timeout, permission, I/O). Retriable:
    nothing visible changed, and the same call may succeed later."""

    code = KafkaStorageError.code
    retriable = True


class RemoteObjectNotFoundError(RemoteStorageError):
    """An object a manifest names is missing: the segment was deleted (remote retention, a topic
    deletion) after the caller read its manifest. Reload the manifest and look again."""


class UploadVerificationError(RemoteStorageError):
    """An uploaded object does not read back as it was sent (size or CRC32C differ). The attempt's
    objects were deleted (or are left unreferenced for `clean_orphans`); uploading again is safe."""


class ManifestConflictError(RemoteStorageError):
    """A manifest commit lost its compare-and-set: a version newer than the one the writer read
    exists (another broker leads the partition now, or this one's view is stale). Reload the
    manifest and check leadership before trying again; a stale writer must stop."""

    retriable = False


class ManifestFencedError(ManifestConflictError):
    """A manifest commit came from a deposed leader: the partition's current manifest was
    committed by the leader of a later epoch (which commits a version carrying its epoch as soon as
    it takes over). Nothing was written; this writer must stop writing the partition's manifest."""


class RemoteTopicIdMismatchError(RemoteStorageError):
    """The partition's remote manifest belongs to another incarnation of the topic (same name,
    other topic id): its segments must not be served as this topic's."""

    retriable = False
