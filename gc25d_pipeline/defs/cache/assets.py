"""Training cache (dataset card): pack processed clips into verified shards and publish snapshots;
one partition per immutable snapshot, verified before anything trains on it."""

import dagster as dg

from gc25d_core.cache.from_layout import RejectedReceiptsError, open_cache_store, pack_and_publish
from gc25d_core.cache.manifest import parse_snapshot_id
from gc25d_core.cache.publish import verify_snapshot
from gc25d_core.cache.snapshots import read_snapshot
from gc25d_core.report import log_to
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.prep.assets import cond, cond_ext, ext_canvas, latents
from gc25d_pipeline.lib.project import Gc25dProject

# The moving manifest.json pointer lives outside Dagster; the sensor records its versions here.
dataset_manifest = dg.AssetSpec(
    "dataset_manifest", group_name="cache", description="manifest.json of the training cache (observed)"
)


def snapshot_version(key: str) -> int:
    """ "v000123" → 123 (partition keys come from the sensor, which writes them with snapshot_id)."""
    version = parse_snapshot_id(key)
    if version is None:
        raise dg.Failure(f"partition key {key!r} is not a snapshot id like v000123")
    return version


class _LogReporter:
    def __init__(self, context: dg.AssetExecutionContext):
        self.context = context

    def log(self, message: str, level: str = "info") -> None:
        log_to(self.context.log, message, level)


@dg.asset(group_name="cache", deps=[latents, cond, cond_ext, ext_canvas], kinds={"python"})
def training_cache(context: dg.AssetExecutionContext, project: Gc25dProject) -> dg.MaterializeResult:
    """Shards + receipts for the clips the cache does not hold yet, then the next snapshot
    (parent-checked). Fails when the publisher rejects a receipt: its clips would be in no snapshot."""
    cfg = project.config()
    try:
        summary = pack_and_publish(cfg, reporter=_LogReporter(context))
    except RejectedReceiptsError as e:
        raise dg.Failure(description=str(e), metadata={"rejected": dg.MetadataValue.json(e.rejected)}) from e
    version = summary["commit"] or "empty"
    return dg.MaterializeResult(metadata=summary, data_version=dg.DataVersion(version))


@dg.asset(group_name="cache", partitions_def=cache_snapshots, deps=[dataset_manifest], kinds={"python"})
def cache_snapshot(context: dg.AssetExecutionContext, project: Gc25dProject) -> dg.MaterializeResult:
    """One immutable snapshot (manifests/vNNNNNN.json, never the moving manifest.json), deep-verified:
    every listed shard's bytes and SHA256 and every sample's schema."""
    cfg = project.config()
    store = open_cache_store(cfg)
    version = snapshot_version(context.partition_key)
    snap = read_snapshot(store, version)
    report = verify_snapshot(store, version, revision=snap.ref.commit, deep=True)  # the commit reported
    if not report.ok:
        raise dg.Failure(
            f"snapshot {context.partition_key} failed verification",
            metadata={"failures": dg.MetadataValue.json(report.failures[:20])},
        )
    m = snap.manifest
    return dg.MaterializeResult(
        metadata={
            "commit": snap.ref.commit,
            "manifest_sha256": snap.ref.sha256,
            "schema": m.schema_name,
            "num_shards": len(m.shards),
            "verified_samples": report.samples,
            "verified_bytes": report.bytes,
            "totals": dg.MetadataValue.json(m.totals.model_dump(mode="json")),
        },
        data_version=dg.DataVersion(snap.ref.sha256),
    )
