"""React to new immutable training-cache snapshots: one dynamic partition and one run per snapshot."""

import dagster as dg

from gc25d_core.cache.manifest import snapshot_id
from gc25d_core.cache.snapshots import list_versions
from gc25d_core.cache.stores import open_cache_store
from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.project import Gc25dProject

snapshot_job = dg.define_asset_job(
    "cache_snapshot_job",
    selection=[cache_snapshot],
    description="Verify (and later train on) one immutable training-cache snapshot",
)


@dg.sensor(
    job=snapshot_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute: one cache_snapshots partition and one verification run (cache_snapshot) "
    "per snapshot that training_cache has published since the last tick (manifests/vNNNNNN.json) "
    "and that is not verified yet",
)
def cache_snapshot_sensor(context: dg.SensorEvaluationContext, project: Gc25dProject):
    """Cursor = the highest snapshot version seen; run_key = snapshot id (idempotent if the cursor is
    lost). A snapshot is immutable, so one whose cache_snapshot partition is materialized already
    (`make run` verifies it in-process) is verified: it gets its partition but no run."""
    store = open_cache_store(project.config())
    seen = int(context.cursor or 0)
    new = [v for v in list_versions(store) if v > seen]
    if not new:
        return dg.SkipReason(f"no snapshot newer than v{seen:06d}")
    keys = [snapshot_id(v) for v in new]
    known = set(cache_snapshots.get_partition_keys(dynamic_partitions_store=context.instance))
    verified = context.instance.get_materialized_partitions(cache_snapshot.key)
    if done := [k for k in keys if k in verified]:
        context.log.info(f"verified already, not run again: {', '.join(done)}")
    added = [k for k in keys if k not in known]
    return dg.SensorResult(
        run_requests=[dg.RunRequest(partition_key=k, run_key=k) for k in keys if k not in verified],
        dynamic_partitions_requests=[cache_snapshots.build_add_request(added)] if added else [],
        cursor=str(max(new)),
    )
