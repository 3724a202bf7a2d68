"""Training cache (dataset card seeds/000): manifest snapshots, publisher, verified streaming consumer.

Public API (what the pipeline calls; see each module's docstring for the contract)::

    # stores
    LocalStore(root), HttpStore(url_template, head_url=...), HubStore(repo_id, api=...), open_store(spec)
    # workers
    pack_shard(store, worker=, name=, samples=[(sample_id, pt_bytes | {name: tensor}, json_dict)], schema=)
    gc25d_sample(latents_record, cond_ids=, cond_ext=) -> (sample_id, tensors, json)   # SPEC §5 -> sample
    # publisher
    verify_receipt(store, receipt_path, revision=) ; publish_snapshot(store, ...) -> PublishResult
    import_shards(src, entries, dst, worker=, schema_name=, source_repo=)
    # snapshots
    list_versions(store) -> list[int] ; read_snapshot(store, version) -> Snapshot(ref, manifest)
    verify_snapshot(store, version, deep=)
    # training
    StreamingCache(store, ConsumerConfig(...), manifest=ref) ; merge_state_dicts(states)
"""

from gc25d_core.cache.errors import (
    AlreadyExistsError,
    CacheError,
    CommitUncertainError,
    HttpStreamError,
    ManifestError,
    PublishError,
    RefreshMidEpochError,
    SampleSchemaError,
    ShardError,
    ShardFailure,
    StaleBatchError,
    StaleParentError,
    StateError,
    StoreError,
)
from gc25d_core.cache.manifest import (
    SCHEMA_CSGO,
    SCHEMA_GC25D,
    SCHEMAS,
    Manifest,
    ManifestRef,
    Provenance,
    Receipt,
    SampleSchema,
    ShardEntry,
    SourceRef,
    SplitRule,
    get_schema,
    snapshot_id,
    validate_sample,
    version_path,
)
from gc25d_core.cache.publish import (
    ImportEntry,
    PackResult,
    PublishResult,
    VerifyReport,
    discover_receipts,
    entries_from_listing,
    entries_from_manifest,
    import_shards,
    pack_shard,
    publish_snapshot,
    read_receipt,
    verify_receipt,
    verify_snapshot,
)
from gc25d_core.cache.snapshots import Snapshot, list_versions, read_pinned, read_snapshot
from gc25d_core.cache.stores import Addition, HttpConfig, HttpStore, HubStore, LocalStore, Store, open_store

# the consumer imports torch.utils.data; load it on first use so the CLI and publishers start fast
_LAZY_SAMPLES = {"gc25d_sample"}
_CONSUMER = {
    "CacheBatch",
    "ConsumerConfig",
    "Sample",
    "SampleKey",
    "ShardEvent",
    "StreamingCache",
    "collate_samples",
    "merge_state_dicts",
}


def __getattr__(name: str) -> object:
    if name in _CONSUMER:
        from gc25d_core.cache import consumer

        return getattr(consumer, name)
    if name in _LAZY_SAMPLES:
        from gc25d_core.cache import samples

        return getattr(samples, name)
    raise AttributeError(f"module 'gc25d_core.cache' has no attribute {name!r}")


__all__ = [
    "SCHEMAS",
    "SCHEMA_CSGO",
    "SCHEMA_GC25D",
    "Addition",
    "AlreadyExistsError",
    "CacheBatch",
    "CacheError",
    "CommitUncertainError",
    "ConsumerConfig",
    "HttpConfig",
    "HttpStore",
    "HttpStreamError",
    "HubStore",
    "ImportEntry",
    "LocalStore",
    "Manifest",
    "ManifestError",
    "ManifestRef",
    "PackResult",
    "Provenance",
    "PublishError",
    "PublishResult",
    "Receipt",
    "RefreshMidEpochError",
    "Sample",
    "SampleKey",
    "SampleSchema",
    "SampleSchemaError",
    "ShardEntry",
    "ShardError",
    "ShardEvent",
    "ShardFailure",
    "Snapshot",
    "SourceRef",
    "SplitRule",
    "StaleBatchError",
    "StaleParentError",
    "StateError",
    "Store",
    "StoreError",
    "StreamingCache",
    "VerifyReport",
    "collate_samples",
    "discover_receipts",
    "entries_from_listing",
    "entries_from_manifest",
    "gc25d_sample",
    "get_schema",
    "import_shards",
    "list_versions",
    "merge_state_dicts",
    "open_store",
    "pack_shard",
    "publish_snapshot",
    "read_pinned",
    "read_receipt",
    "read_snapshot",
    "snapshot_id",
    "validate_sample",
    "verify_receipt",
    "verify_snapshot",
    "version_path",
]
