"""The published snapshot behind a cache_snapshots partition, checked before anything runs on it.

A partition key can exist without its snapshot: added by hand in the UI, or left in the instance after
the cache folder was deleted. Nothing a retry does can publish it, so such a step fails at once, naming
what to do, instead of launching a job that fails in every rank and is retried for minutes.
"""

import dagster as dg

from gc25d_core.cache.manifest import parse_snapshot_id, snapshot_id, version_path
from gc25d_core.cache.snapshots import list_versions
from gc25d_core.cache.stores import open_cache_store
from gc25d_core.config import Gc25dConfig


def snapshot_version(partition_key: str) -> int:
    """ "v000123" → 123; a key that is not a snapshot id fails without retries."""
    version = parse_snapshot_id(partition_key)
    if version is None:
        raise dg.Failure(
            f"partition key {partition_key!r} is not a snapshot id like v000123", allow_retries=False
        )
    return version


def published_snapshot(cfg: Gc25dConfig, partition_key: str) -> int:
    """The version of ``partition_key`` if the training cache has published it; else a Failure
    without retries that says which snapshots exist."""
    version = snapshot_version(partition_key)
    store = open_cache_store(cfg)
    published = list_versions(store)
    if version in published:
        return version
    have = ", ".join(snapshot_id(v) for v in published[-5:]) or "none"
    raise dg.Failure(
        f"partition {partition_key} has no snapshot behind it: {version_path(version)} is not published "
        f"in {store.describe()} (newest published: {have}). Partitions come from cache_snapshot_sensor, "
        "one per snapshot training_cache publishes; materialize training_cache first, or delete this "
        "partition key in the UI.",
        allow_retries=False,
        metadata={"published": dg.MetadataValue.json([snapshot_id(v) for v in published])},
    )
