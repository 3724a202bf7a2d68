"""The chain after SFT (SPEC §10): one run of ``distill_chain_job`` (stage 1 → stage 2 → … → eval)
per new teacher pick of a snapshot partition, never two at once for one partition.

A pick is an ``sft_teacher`` materialization; its identity is the data version the asset records
(the picked step and the export's hash), so re-materializing the same pick starts nothing (the
run_key ``<partition>:<pick>`` was requested already). While a chain of that partition is queued or
running, a newer pick waits in the cursor and starts when the partition is idle (only the newest
waiting pick of a partition starts: it supersedes older ones).
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


@dg.sensor(
    job_name=CHAIN_JOB,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="starts the distillation chain and its eval once per new sft_teacher pick of a snapshot",
)
def teacher_pick_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Cursor: {"after": last storage id read, "pending": {partition: pick waiting}, "started":
    {partition: last pick started}} (one entry per partition: it stays small)."""
    state = json.loads(context.cursor) if context.cursor else {}
    after: int | None = state.get("after")
    pending: dict[str, str] = dict(state.get("pending", {}))
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
                pending[rec.partition_key] = pick
        if not page.has_more:
            break
    requests = []
    for partition in sorted(pending):
        if chain_active(context.instance, partition):
            context.log.info(f"{partition}: a chain is still running; pick {pending[partition]} waits")
            continue
        pick = started[partition] = pending.pop(partition)
        requests.append(
            dg.RunRequest(partition_key=partition, run_key=f"{partition}:{pick}", tags={PICK_TAG: pick})
        )
    cursor = {"after": after, "pending": pending, "started": started}
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor))
