import dagster as dg

# The whole graph that exists so far, on the configured preset. Grows with the graph.
# (cache_snapshot and everything after it run per snapshot partition: cache_snapshot through the
# cache sensor's job, sft / sft_teacher through sft_job, the stages after the pick through
# distill_chain_job, which teacher_pick_sensor starts once per new pick.)
full_chain = dg.define_asset_job(
    "full_chain",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("cache_snapshot").downstream(),
    description="Materialize every asset: raw source → clips index / text table → … (grows with the graph)",
    tags={"dagster/max_runtime": str(7 * 24 * 3600)},
)

# Per snapshot partition: train the teacher and pick it (launched from the UI or CLI for a chosen
# snapshot, e.g. `python -m gc25d_pipeline.cli launch sft_job v000001`, which prints the run id). The
# distillation after the pick is distill_chain_job's, so a pick never runs the stages twice at once.
sft_job = dg.define_asset_job(
    "sft_job",
    selection=dg.AssetSelection.assets("sft", "sft_teacher"),
    description="Per snapshot partition: train (or resume) the SFT teacher, then pick it (SPEC §10) "
    "into teacher.json; the distillation chain starts from that pick (teacher_pick_sensor)",
    tags={"gpu": "true", "dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"},
)

# Per snapshot partition, after a teacher pick: stage 1 → stage 2 → (stage 3 → deploy) → eval.
# Started by teacher_pick_sensor (gc25d_pipeline/defs/eval/sensors.py) once per new pick.
distill_chain_job = dg.define_asset_job(
    "distill_chain_job",
    selection=dg.AssetSelection.assets("stage1_tf", "stage2_cd", "stage3_dmd", "eval"),
    description="Per snapshot partition, after a teacher pick: stage 1 → stage 2 → stage 3 → eval",
    tags={"gpu": "true", "dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"},
)
