"""The jobs, each selected from the asset graph (never a hand-kept list of names, which drifts when an
asset is added: tests/test_job_selection.py checks every job covers what its assets read).

- ``full_chain``: everything before the snapshot partitions (raw source → … → training cache).
- ``sft_job``: per snapshot, what lies between ``cache_snapshot`` and the pick (``sft``,
  ``sft_teacher``); launched from the UI or the CLI
  (``python -m gc25d_pipeline.cli launch sft_job v000001`` prints the run id).
- ``distill_chain_job``: per snapshot, everything downstream of the pick (stage 1 → 2 → 3 → deploy
  export → eval); ``teacher_pick_sensor`` starts it once per new pick, so a pick never runs the
  stages twice at once.

``cache_snapshot`` itself runs through the cache sensor's ``cache_snapshot_job``.
"""

import dagster as dg

from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.train.assets import sft_teacher

_snapshot = dg.AssetSelection.assets(cache_snapshot)
_pick = dg.AssetSelection.assets(sft_teacher)

# Run retries: a job opts in with dagster/max_retries (the instance's run_retries); a run a user
# stops ends CANCELED, which Dagster never retries. A failed rank is retried inside the run by the
# step's RetryPolicy (lib/stage_assets.py), which resumes from the run folder.
_GPU_RUN_TAGS = {"gpu": "true", "dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"}

full_chain = dg.define_asset_job(
    "full_chain",
    selection=dg.AssetSelection.all() - _snapshot.downstream(),
    description="Materialize everything before the snapshot partitions: raw source → clips index / text "
    "table → … → training cache",
    tags={"dagster/max_runtime": str(7 * 24 * 3600)},
)

sft_job = dg.define_asset_job(
    "sft_job",
    selection=(_snapshot.downstream() & _pick.upstream()) - _snapshot,
    description="Per snapshot partition: train (or resume) the SFT teacher, then pick it (SPEC §10) "
    "into teacher.json; the distillation chain starts from that pick (teacher_pick_sensor)",
    tags=_GPU_RUN_TAGS,
)

distill_chain_job = dg.define_asset_job(
    "distill_chain_job",
    selection=_pick.downstream() - _pick,
    description="Per snapshot partition, after a teacher pick: everything downstream of sft_teacher "
    "(stage 1 → stage 2 → stage 3 → deploy export → eval)",
    tags=_GPU_RUN_TAGS,
)
