"""The training stages per training-cache snapshot: one stage asset per entry of the stage table
(gc25d_core.stages), and the SPEC §10 pick of the SFT teacher between the SFT and the distillation.

Each stage asset (gc25d_pipeline.lib.stage_assets) is a torchrun job whose run folder is fixed per
snapshot partition, so a retry, a re-execution or a relaunch resumes from the latest rotating state.
``sft_teacher`` applies the pick rule to the sft run folder and writes the pick as ``teacher.json``
there: the hand-off the stages with ``init_from=Upstream("sft")`` read.
"""

import dagster as dg
from pydantic import Field

from gc25d_core.config import config_from_yaml
from gc25d_core.handoff import TEACHER, handoff_of, write_handoff_file
from gc25d_core.stages import STAGES
from gc25d_core.train.pick import PickError, pick_sft_run
from gc25d_core.train.presets import stage_config
from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.previews import sft_preview_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.stage_assets import RUN_FOLDER_KEY, table_assets

SFT = "sft"  # the stage the §10 pick picks from (its run folder holds teacher.json)


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
    deps=[dg.AssetKey(SFT)],
    kinds={"python"},
    # teacher.json lives in the sft run folder it picks from: init_from=(sft_teacher, ...) reads it there
    metadata={RUN_FOLDER_KEY: SFT},
)
def sft_teacher(
    context: dg.AssetExecutionContext, config: SftTeacherConfig, project: Gc25dProject
) -> dg.MaterializeResult:
    """SPEC §10: lowest mean cond val mse among steps ≥ min_step, the latest within rel_tol of it;
    written to <sft run folder>/teacher.json for the next stage."""
    cfg = project.config()
    run_dir = project.run_dir(cfg, SFT, context).resolve()
    resolved = run_dir / "config.yaml"
    if not resolved.is_file():
        raise dg.Failure(f"{resolved} does not exist: materialize sft for {context.partition_key} first")
    rule = stage_config(config_from_yaml(resolved), SFT).pick
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


# stage -> its asset (named after the stage); stage -> the asset that writes its hand-off file
STAGE_ASSETS, HANDOFF_WRITERS = table_assets(
    STAGES,
    picks={SFT: sft_teacher},
    first_deps=[cache_snapshot],
    previews={SFT: sft_preview_metadata},
)
# the definitions loader collects assets from module-level lists
stage_assets: list[dg.AssetsDefinition] = list(STAGE_ASSETS.values())
