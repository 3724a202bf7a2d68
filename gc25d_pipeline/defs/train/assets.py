"""SPEC §7 SFT teacher per training-cache snapshot, and the §10 pick rule.

``sft`` is a torchrun job (accelerate-free DeepSpeed ZeRO-2, see gc25d_core.train.sft) whose run
folder is fixed per snapshot partition, so a retry, a re-execution or a relaunch resumes from the
latest rotating state; ``fresh`` starts over. ``sft_teacher`` applies the pick rule to that folder.
"""

import dagster as dg

from gc25d_core.config import config_from_yaml
from gc25d_core.train.pick import PickError, pick_sft_run
from gc25d_core.train.sft import sft_config, with_sft
from gc25d_pipeline.defs.cache.assets import cache_snapshot, snapshot_version
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


class SftRunConfig(dg.Config):
    # a name (gc25d_core.names) for configs/sft/<name>.yaml; empty = the project preset's (tiny / v10)
    sft_preset: str = ""
    max_steps: int = 0  # 0 = the preset's max_steps
    fresh: bool = False


class SftTeacherConfig(dg.Config):
    min_step: int | None = None  # None: the SFT run's own sft.pick settings (SPEC: 6000, 0.5 %)
    rel_tol: float | None = None


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
    run_dir = project.run_dir(project.config(), "sft", context)
    resolved = run_dir / "config.yaml"
    if not resolved.is_file():
        raise dg.Failure(f"{resolved} does not exist: materialize sft for {context.partition_key} first")
    rule = sft_config(config_from_yaml(resolved)).pick
    min_step = rule.min_step if config.min_step is None else config.min_step
    rel_tol = rule.rel_tol if config.rel_tol is None else config.rel_tol
    try:
        pick = pick_sft_run(run_dir, min_step=min_step, rel_tol=rel_tol)
    except PickError as e:
        raise dg.Failure(f"no SFT teacher can be picked in {run_dir}: {e}") from None
    return dg.MaterializeResult(
        metadata={**pick.metadata(), "export": dg.MetadataValue.path(str(pick.path))},
        data_version=dg.DataVersion(f"step-{pick.step}"),
    )
