"""SPEC §7 SFT teacher per training-cache snapshot, and the §10 pick rule.

``sft`` is a torchrun job (accelerate-free DeepSpeed ZeRO-2, see gc25d_core.train.sft) whose run
folder is fixed per snapshot partition, so a retry, a re-execution or a relaunch resumes from the
latest rotating state; ``fresh`` starts over. ``sft_teacher`` applies the pick rule to that folder.
"""

import dagster as dg

from gc25d_core.train.pick import DEFAULT_MIN_STEP, DEFAULT_REL_TOL, PickError, pick_sft_run
from gc25d_core.train.sft import with_sft
from gc25d_pipeline.defs.cache.assets import cache_snapshot, snapshot_version
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


class SftRunConfig(dg.Config):
    sft_preset: str = ""  # configs/sft/<name>.yaml; empty = the project preset's name (tiny / v10)
    max_steps: int = 0  # 0 = the preset's max_steps
    fresh: bool = False


class SftTeacherConfig(dg.Config):
    min_step: int = DEFAULT_MIN_STEP
    rel_tol: float = DEFAULT_REL_TOL


@dg.asset(
    group_name="train",
    partitions_def=cache_snapshots,
    deps=[cache_snapshot],
    kinds={"torch", "deepspeed"},
    pool="gpu",
    retry_policy=dg.RetryPolicy(max_retries=3, delay=60, backoff=dg.Backoff.EXPONENTIAL),
    tags={"gpu": "true"},
)
def sft(
    context: dg.AssetExecutionContext, config: SftRunConfig, project: Gc25dProject, torchrun: TorchrunLauncher
) -> dg.MaterializeResult:
    """Train (or resume) the bidirectional teacher on this snapshot; progress streams to the run log."""
    base = project.config()
    cfg = with_sft(
        base,
        config.sft_preset or base.name,
        {"data": {"manifest_version": snapshot_version(context.partition_key)}},
    )
    args = (["--max-steps", str(config.max_steps)] if config.max_steps else []) + (
        ["--fresh"] if config.fresh else []
    )
    run_dir = project.run_dir(cfg, "sft", context)
    return torchrun.launch(context, "gc25d_core.jobs.sft", cfg, run_dir, args).get_materialize_result()


@dg.asset(group_name="train", partitions_def=cache_snapshots, deps=[sft], kinds={"python"})
def sft_teacher(
    context: dg.AssetExecutionContext, config: SftTeacherConfig, project: Gc25dProject
) -> dg.MaterializeResult:
    """SPEC §10: lowest mean cond val mse among steps ≥ min_step, the latest within rel_tol of it."""
    cfg = project.config()
    run_dir = project.run_dir(cfg, "sft", context)
    try:
        pick = pick_sft_run(run_dir, min_step=config.min_step, rel_tol=config.rel_tol)
    except PickError as e:
        raise dg.Failure(f"no SFT teacher can be picked in {run_dir}: {e}") from None
    return dg.MaterializeResult(
        metadata={**pick.metadata(), "export": dg.MetadataValue.path(str(pick.path))},
        data_version=dg.DataVersion(f"step-{pick.step}"),
    )
