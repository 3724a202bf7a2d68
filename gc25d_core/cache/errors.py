"""Exceptions of the training cache. Every data-integrity error names shard, sample and byte offset.

All classes can be rebuilt from one message string, so a torch DataLoader worker can re-raise them
in the main process (torch's ExceptionWrapper calls ``exc_type(msg)``).
"""

from __future__ import annotations


class CacheError(Exception):
    """Base class of every training-cache error."""


class ManifestError(CacheError):
    """A manifest (or receipt) that does not parse or violates the schema rules."""


class ShardError(CacheError):
    """A shard failed verification or could not be read; says where.

    ``shard``: path in the store; ``sample``: the sample id being read (or expected) when it
    failed, None when the failure is not tied to one sample (whole-TAR size/SHA256);
    ``offset``: byte offset in the TAR (member header or data start, or bytes read so far).
    ``kind``: "verify" (the bytes are wrong) or "io" (they could not be fetched).
    """

    def __init__(
        self,
        reason: str,
        *,
        shard: str | None = None,
        sample: str | None = None,
        offset: int | None = None,
        kind: str = "verify",
    ):
        self.reason, self.shard, self.sample, self.offset, self.kind = reason, shard, sample, offset, kind
        if shard is None:  # rebuilt from a message (DataLoader re-raise) or a bare error
            super().__init__(reason)
        else:
            super().__init__(format_location(shard, sample, offset) + ": " + reason)


def format_location(shard: str | None, sample: str | None, offset: int | None) -> str:
    s = "-" if sample is None else sample
    o = "-" if offset is None else str(offset)
    return f"shard {shard} sample {s} offset {o}"


class SampleSchemaError(CacheError):
    """A deserialised sample whose tensors / json fields do not match the schema."""


class StoreError(CacheError):
    """A store operation failed (not found, not committed at that revision, read-only, ...)."""


class NotCommittedError(StoreError):
    """The path is not part of the requested revision."""


class AlreadyExistsError(StoreError):
    """A create-only path already exists with different content (versions are never overwritten)."""


class StaleParentError(StoreError):
    """Compare-and-swap lost: the store head is not the expected parent (HTTP 412 on the Hub)."""

    def __init__(self, message: str, *, expected: str | None = None, actual: str | None = None):
        super().__init__(message)
        self.expected, self.actual = expected, actual


class CommitUncertainError(StoreError):
    """A commit call failed without a clear answer; it may or may not have landed."""


class HttpStreamError(StoreError):
    """HTTP streaming failed loud: bad status, wrong Content-Range, or retries exhausted."""

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.url, self.offset = url, offset


class PublishError(CacheError):
    """The publisher could not land a snapshot within its attempt budget."""


class StateError(CacheError):
    """A consumer state that does not fit this dataset (manifest, seed, split, exclusions)."""


class RefreshMidEpochError(StateError):
    """Manifest refresh requested after the epoch started; refresh only at an epoch boundary."""


class StaleBatchError(StateError):
    """A batch from another epoch or manifest reached the tracker (e.g. a leftover iterator)."""


class ShardFailure(CacheError):
    """Raised by the consumer in the main process when a shard failed (on_shard_failure='fail')."""

    def __init__(self, message: str, *, event: object | None = None):
        super().__init__(message)
        self.event = event
