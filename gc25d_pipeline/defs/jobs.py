import dagster as dg

# The whole graph that exists so far, on the configured preset. Grows with the graph.
# (cache_snapshot and everything after it run per snapshot partition: cache_snapshot through the
# cache sensor's job, sft / sft_teacher / the distillation stages through sft_job.)
full_chain = dg.define_asset_job(
    "full_chain",
    selection=dg.AssetSelection.all() - dg.AssetSelection.assets("cache_snapshot").downstream(),
    description="Materialize every asset: raw source → clips index / text table → … (grows with the graph)",
    tags={"dagster/max_runtime": str(7 * 24 * 3600)},
)

# Per snapshot partition: train the teacher, pick it, and distil it (launched from the UI or CLI for a
# chosen snapshot, e.g. `dagster job launch -j sft_job --tags '{"dagster/partition": "v000001"}'`).
sft_job = dg.define_asset_job(
    "sft_job",
    selection=dg.AssetSelection.assets("sft", "sft_teacher", "stage1_tf", "stage2_cd", "stage3_dmd"),
    tags={"gpu": "true", "dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"},
)
