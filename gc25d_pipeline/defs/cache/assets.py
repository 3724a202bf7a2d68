"""Training cache (dataset card): pack processed clips into verified shards and publish snapshots;
one partition per immutable snapshot, verified before anything trains on it."""

import dagster as dg

from gc25d_core.cache.from_layout import RejectedReceiptsError, pack_and_publish
from gc25d_core.cache.publish import verify_snapshot
from gc25d_core.cache.snapshots import read_snapshot
from gc25d_core.cache.stores import open_cache_store
from gc25d_core.report import human_bytes
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.prep.assets import cond, cond_ext, ext_canvas, latents
from gc25d_pipeline.lib.context_reporter import ContextReporter
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.snapshots import published_snapshot


@dg.asset(group_name="cache", deps=[latents, cond, cond_ext, ext_canvas], kinds={"python"})
def training_cache(context: dg.AssetExecutionContext, project: Gc25dProject) -> dg.MaterializeResult:
    """Shards + receipts for the clips the cache does not hold yet, then the next snapshot
    (parent-checked). Fails when the publisher rejects a receipt: its clips would be in no snapshot."""
    cfg = project.config()
    try:
        summary = pack_and_publish(cfg, reporter=ContextReporter(context))
    except RejectedReceiptsError as e:
        raise dg.Failure(description=str(e), metadata={"rejected": dg.MetadataValue.json(e.rejected)}) from e
    version = summary["commit"] or "empty"
    return dg.MaterializeResult(metadata=summary, data_version=dg.DataVersion(version))


# training_cache publishes the snapshots these partitions name: the edge orders every run and backfill
# that selects both (publish, then verify, then train), and the lineage shows where snapshots come from.
@dg.asset(group_name="cache", partitions_def=cache_snapshots, deps=[training_cache], kinds={"python"})
def cache_snapshot(context: dg.AssetExecutionContext, project: Gc25dProject) -> dg.MaterializeResult:
    """One immutable snapshot (manifests/vNNNNNN.json, never the moving manifest.json), deep-verified:
    every listed shard's bytes and SHA256 and every sample's schema. A partition whose snapshot was
    never published fails at once, without retries."""
    cfg = project.config()
    version = published_snapshot(cfg, context.partition_key)
    store = open_cache_store(cfg)
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
            "verified_size": human_bytes(report.bytes),
            "totals": dg.MetadataValue.json(m.totals.model_dump(mode="json")),
        },
        data_version=dg.DataVersion(snap.ref.sha256),
    )
