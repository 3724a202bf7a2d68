"""The chain after SFT (SPEC §10): one run of ``distill_chain_job`` (everything downstream of the pick:
stage 1 → stage 2 → stage 3 → deploy export → eval) per new teacher pick of a snapshot partition,
never two at once for one partition.

A pick is an ``sft_teacher`` materialization; its identity is the data version the asset records
(the picked step and the export's hash), so re-materializing the same pick starts nothing (the
run_key ``<partition>:<pick>`` was requested already). While a chain of that partition is queued or
running, a newer pick waits in the cursor and starts when the partition is idle (only the newest
waiting pick of a partition starts: it supersedes older ones).

What already exists is not run again: a chain asset materialized after the pick (and after its own
upstream chain assets) is done, whoever materialized it (``make run``, a launch from the UI, an
earlier daemon). A pick whose chain is all done starts nothing; a chain that stopped part-way starts
from the first asset that is not done. So a daemon started with an empty cursor over an instance that
already holds the results (``make dev`` after ``make run``) launches nothing.
"""

import json

import dagster as dg

from gc25d_pipeline.defs.train.assets import sft_teacher

CHAIN_JOB = "distill_chain_job"
ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
PICK_TAG = "gc25d/teacher_pick"


def chain_active(instance: dg.DagsterInstance, partition: str) -> bool:
    runs = instance.get_run_records(
        filters=dg.RunsFilter(job_name=CHAIN_JOB, tags={"dagster/partition": partition}, statuses=ACTIVE),
        limit=1,
    )
    return bool(runs)


def _latest(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> int | None:
    """Storage id of the newest materialization of ``key`` for ``partition`` (None: never)."""
    page = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1, ascending=False
    )
    return page.records[0].storage_id if page.records else None


def chain_to_run(
    instance: dg.DagsterInstance, repo: dg.RepositoryDefinition, partition: str, pick_id: int
) -> list[dg.AssetKey]:
    """The chain job's assets that are not done for ``partition`` since the pick materialized at
    storage id ``pick_id``, in graph order; an asset is done when it materialized after the pick and
    after every chain asset it reads (then it was built from them)."""
    graph = repo.asset_graph
    chain = set(repo.get_job(CHAIN_JOB).asset_layer.selected_asset_keys)
    done_at: dict[dg.AssetKey, int] = {}
    todo = []
    for key in graph.toposorted_asset_keys:
        if key not in chain:
            continue
        parents = [p for p in graph.get(key).parent_keys if p in chain]
        latest = _latest(instance, key, partition)
        inputs_at = max([pick_id, *(done_at.get(p, -1) for p in parents)])
        if latest is not None and latest > inputs_at and all(p in done_at for p in parents):
            done_at[key] = latest
        else:
            todo.append(key)
    return todo


@dg.sensor(
    job_name=CHAIN_JOB,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="starts the distillation chain and its eval once per new sft_teacher pick of a snapshot "
    "(only the part of the chain not yet materialized for that pick)",
)
def teacher_pick_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Cursor: {"after": last storage id read, "pending": {partition: [pick, its storage id]},
    "started": {partition: last pick started or found done}} (one entry per partition: it stays
    small)."""
    repo = context.repository_def
    if repo is None:
        raise dg.DagsterInvariantViolationError("teacher_pick_sensor needs its repository (the chain job)")
    state = json.loads(context.cursor) if context.cursor else {}
    after: int | None = state.get("after")
    pending: dict[str, list] = {
        p: v if isinstance(v, list) else [v, 0] for p, v in state.get("pending", {}).items()
    }
    started: dict[str, str] = dict(state.get("started", {}))
    while True:
        page = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=sft_teacher.key, after_storage_id=after),
            limit=100,
            ascending=True,
        )
        for rec in page.records:
            after = rec.storage_id
            mat = rec.asset_materialization
            if rec.partition_key is None or mat is None:
                continue
            pick = (mat.tags or {}).get("dagster/data_version") or f"event-{rec.storage_id}"
            if started.get(rec.partition_key) == pick:
                pending.pop(rec.partition_key, None)  # the same pick again: its chain exists
            else:
                pending[rec.partition_key] = [pick, rec.storage_id]
        if not page.has_more:
            break
    requests = []
    for partition in sorted(pending):
        pick, pick_id = pending[partition]
        if chain_active(context.instance, partition):
            context.log.info(f"{partition}: a chain is still running; pick {pick} waits")
            continue
        del pending[partition]
        started[partition] = pick
        todo = chain_to_run(context.instance, repo, partition, pick_id)
        if not todo:
            context.log.info(f"{partition}: the chain of pick {pick} is materialized already")
            continue
        requests.append(
            dg.RunRequest(
                partition_key=partition,
                run_key=f"{partition}:{pick}",
                tags={PICK_TAG: pick},
                asset_selection=todo,
            )
        )
    cursor = {"after": after, "pending": pending, "started": started}
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor))
