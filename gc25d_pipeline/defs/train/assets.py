"""SPEC §7 SFT teacher per training-cache snapshot, the §10 pick rule, and the distillation stages after it.

``sft`` is a stage asset (gc25d_pipeline.lib.stage_assets): a torchrun job (DeepSpeed ZeRO-2
through accelerate, see gc25d_core.train.sft) whose run folder is fixed per snapshot partition, so a
retry, a re-execution or a relaunch resumes from the latest rotating state. ``sft_teacher`` applies
the pick rule to that folder and writes the pick as ``teacher.json`` there: the hand-off the next
stage's ``init_from`` reads.
"""

import dagster as dg
from pydantic import Field

from gc25d_core.config import config_from_yaml
from gc25d_core.handoff import FINAL, TEACHER, handoff_of, write_handoff_file
from gc25d_core.train.pick import PickError, pick_sft_run
from gc25d_core.train.sft import sft_config
from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.previews import sft_preview_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.stage_assets import RUN_FOLDER_KEY, run_folder_of, stage_asset

sft = stage_asset(
    "sft",
    "sft",
    deps=[cache_snapshot],
    kinds=("torch", "deepspeed"),
    description="Train (or resume) the bidirectional teacher on this snapshot; progress streams to the run log. "
    "Its metadata shows the validation curves, the cond / uncond gap and a validation sample "
    "(ground truth | prediction at t=500 | ids) as a video.",
    previews=sft_preview_metadata,
)


class SftTeacherConfig(dg.Config):
    min_step: int | None = Field(
        default=None, description="None: the SFT run's own sft.pick.min_step (SPEC: 6000)"
    )
    rel_tol: float | None = Field(
        default=None, description="None: the SFT run's own sft.pick.rel_tol (SPEC: 0.5 %)"
    )


@dg.asset(
    group_name="train",
    partitions_def=cache_snapshots,
    deps=[sft],
    kinds={"python"},
    # teacher.json lives in the sft run folder it picks from: init_from=(sft_teacher, ...) reads it there
    metadata={RUN_FOLDER_KEY: run_folder_of(sft)},
)
def sft_teacher(
    context: dg.AssetExecutionContext, config: SftTeacherConfig, project: Gc25dProject
) -> dg.MaterializeResult:
    """SPEC §10: lowest mean cond val mse among steps ≥ min_step, the latest within rel_tol of it;
    written to <sft run folder>/teacher.json for the next stage."""
    cfg = project.config()
    run_dir = project.run_dir(cfg, run_folder_of(sft), context).resolve()
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
    assert pick.path is not None  # pick_sft_run always names the export
    ema = pick.path.parent / "ema" / pick.path.name  # the step's EMA export, where SFT keeps one
    handoff = handoff_of(
        "sft", pick.step, pick.path, ema if ema.is_file() else None, runs_root=cfg.paths.runs_root
    )
    teacher = write_handoff_file(run_dir / TEACHER, handoff)
    pick_md = {k: v for k, v in pick.metadata().items() if k != "path"}  # the export is in handoff
    return dg.MaterializeResult(
        metadata={
            **pick_md,
            "handoff": dg.MetadataValue.path(str(teacher)),
            "export": dg.MetadataValue.path(str(pick.path)),
            "sha256": handoff.sha256,
        },
        # the export's hash: a re-trained run that exports the same step is a new teacher
        data_version=dg.DataVersion(f"step-{pick.step}-{handoff.sha256[:16]}"),
    )


stage1_tf = stage_asset(
    "stage1_tf",
    "stage1_tf",
    init_from=(sft_teacher, TEACHER, "export"),
    kinds=("torch", "deepspeed"),
    description="SPEC §8 stage 1: the causal student by teacher forcing from the picked teacher "
    "(teacher.json); its final.json is stage 2's init.",
)


stage2_cd = stage_asset(
    "stage2_cd",
    "stage2_cd",
    init_from=(stage1_tf, FINAL, "export"),
    kinds=("torch", "deepspeed"),
    description="SPEC §8 stage 2: causal consistency distillation onto the 4-step deploy axis with an EMA "
    "target, from stage 1's final export; its EMA exports are the deploy candidate and stage 3's init.",
)


stage3_dmd = stage_asset(
    "stage3_dmd",
    "stage3_dmd",
    init_from=(stage2_cd, FINAL, "ema"),
    real_from=(sft_teacher, TEACHER, "export"),
    kinds=("torch", "fsdp"),
    description="SPEC §8 stage 3: DMD with self-rollout from stage 2's EMA, the SFT teacher as real score and "
    "critic init, FSDP; its EMA exports are what deploy takes.",
)
