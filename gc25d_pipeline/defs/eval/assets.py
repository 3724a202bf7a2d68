"""SPEC §10 evaluation per snapshot partition: every export of the chain that exists, on the clip28
and chain241 sweeps (gc25d_core.eval), with the plots and the comparison table in the metadata.

``EVAL_SOURCES`` is the extension point: (label, upstream asset, hand-off file) in chain order. A
hand-off with an EMA export adds ``<label>_ema``; the deploy export (deploy_export's final.json) is one. Stage 3's EMA milestones join here the same way.
"""

from typing import NamedTuple

import dagster as dg
from pydantic import Field

from gc25d_core.eval.evaluate import EvalConfig, EvalExport, exports_of_handoff
from gc25d_core.handoff import FINAL, TEACHER
from gc25d_core.schema import ConfigError
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.deploy.assets import deploy_export
from gc25d_pipeline.defs.train.assets import sft_teacher, stage1_tf, stage2_cd, stage3_dmd
from gc25d_pipeline.lib.previews import eval_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.snapshots import published_snapshot
from gc25d_pipeline.lib.stage_assets import run_folder_of


class EvalSource(NamedTuple):
    label: str
    asset: dg.AssetsDefinition
    file: str


EVAL_SOURCES: tuple[EvalSource, ...] = (
    EvalSource("sft", sft_teacher, TEACHER),
    EvalSource("stage1_tf", stage1_tf, FINAL),
    EvalSource("stage2_cd", stage2_cd, FINAL),
    EvalSource("stage3_dmd", stage3_dmd, FINAL),
    EvalSource("deploy", deploy_export, FINAL),
    # stage 3's EMA milestones join here the same way
)


class EvalRunConfig(dg.Config):
    clip28_clips: int = Field(default=4, ge=0, description="has_ext val clips of clip28 (0: skip)")
    chain241_chains: int = Field(default=2, ge=0, description="val runs of chain241 (0: skip)")
    teacher_steps: int = Field(default=40, ge=1, description="Euler steps of the bidirectional teacher")
    decode: bool = Field(default=True, description="decode rollouts with the VAE for the pixel metrics")
    seed: int = Field(
        default=0, description="seed of the rollouts' noise (the same seed: comparable exports)"
    )


def available_exports(
    project: Gc25dProject, context: dg.AssetExecutionContext
) -> tuple[list[EvalExport], list[str]]:
    """The exports of the sources whose hand-off file exists for this partition, and what is skipped."""
    cfg = project.config()
    exports: list[EvalExport] = []
    skipped: list[str] = []
    for src in EVAL_SOURCES:
        path = project.run_dir(cfg, run_folder_of(src.asset), context) / src.file
        if not path.is_file():
            skipped.append(f"{src.label}: no {path}")
            continue
        try:
            exports += exports_of_handoff(src.label, path, cfg.paths.runs_root)
        except ConfigError as e:
            raise dg.Failure(f"eval source {src.label}: {e}", allow_retries=False) from None
    return _without_deployed_copies(exports, skipped)


def _without_deployed_copies(
    exports: list[EvalExport], skipped: list[str]
) -> tuple[list[EvalExport], list[str]]:
    """A deploy export holds the weights of the export it was copied from (stage 3's EMA by
    default): when that one is evaluated too, its rollouts would be the same, so it is left out."""
    from gc25d_core.deploy.export import deployed_from

    by_sha = {e.sha256: e.label for e in exports if e.sha256 is not None}
    kept: list[EvalExport] = []
    for e in exports:
        source = deployed_from(e.path, e.sha256)  # the file's hash is checked before its header is read
        if source is not None and source in by_sha and by_sha[source] != e.label:
            skipped.append(f"{e.label}: the same weights as {by_sha[source]} (its deploy copy)")
            continue
        kept.append(e)
    return kept, skipped


@dg.asset(
    name="eval",
    group_name="eval",
    partitions_def=cache_snapshots,
    deps=[src.asset for src in EVAL_SOURCES],
    kinds={"torch"},
    pool="gpu",
    tags={"gpu": "true"},
    description="SPEC §10 eval sweep (clip28, chain241) of every export of the chain that exists for this "
    "snapshot. Its metadata starts with the comparison table and the drift plot, then what was measured "
    "and the whole report (every plot inline); the run folder holds report.md, the plots and per-export JSON.",
)
def eval_asset(
    context: dg.AssetExecutionContext, config: EvalRunConfig, project: Gc25dProject
) -> dg.MaterializeResult:
    import torch

    from gc25d_core.distributed import pick_device
    from gc25d_core.eval.evaluate import Reference, evaluate_export, load_cases, vae_decoder
    from gc25d_core.eval.report import write_reports

    cfg = project.config()
    version = published_snapshot(cfg, context.partition_key)
    exports, skipped = available_exports(project, context)
    for line in skipped:
        context.log.info(f"not evaluated (not produced yet): {line}")
    if not exports:
        raise dg.Failure(f"no export to evaluate for {context.partition_key}: " + "; ".join(skipped))
    ecfg = EvalConfig(
        clip28_clips=config.clip28_clips,
        chain241_chains=config.chain241_chains,
        teacher_steps=config.teacher_steps,
        decode=config.decode,
        seed=config.seed,
        teacher_window=cfg.timeline.num_cells,
    )
    cases, clips = load_cases(cfg, ecfg, version)
    context.log.info(
        f"snapshot v{version:06d}: "
        + ", ".join(f"{sweep} {len(c)} cases" for sweep, c in cases.items())
        + f"; exports {[e.label for e in exports]}"
    )
    decode = None
    if ecfg.decode:
        from gc25d_core.models.vae import build_vae_for

        device = pick_device(cfg)
        decode = vae_decoder(build_vae_for(cfg, device))
    ref = Reference(clips, decode)
    results = []
    for export in exports:
        results.append(evaluate_export(export, cfg, ecfg, cases, ref, log=context.log.info))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    run_dir = project.run_dir(cfg, "eval", context)
    files = write_reports(run_dir, results, ecfg.psnr_cap_db)
    context.log.info("eval table\n" + files.table)
    measured = measured_markdown(version, ecfg, {sweep: len(c) for sweep, c in cases.items()}, exports)
    return dg.MaterializeResult(
        metadata=eval_metadata(files, results, measured, [e.label for e in exports], skipped)
    )


def measured_markdown(
    version: int, ecfg: EvalConfig, num_cases: dict[str, int], exports: list[EvalExport]
) -> str:
    """What the table measures, in a few lines (the asset page shows it inline; report has the rest)."""
    sweeps = {
        "clip28": "28 cells from a val clip's cell 0, its own ids and prompts; ground truth cells 0–20",
        "chain241": "61 cells (241 frames) along a val run; ground truth where its clips have latents",
    }
    lines = [f"**snapshot v{version:06d}**, the same noise for every export (seed {ecfg.seed})"]
    lines += [f"- **{s}**: {n} cases — {sweeps.get(s, '')}" for s, n in num_cases.items()]
    lines.append(
        "- exports: "
        + ", ".join(f"{e.label} (step {e.step})" for e in exports)
        + f"; the teacher samples with {ecfg.teacher_steps} Euler steps"
    )
    lines.append(
        "- latent MSE against the ground-truth latents; "
        + ("PSNR / ΔtPSNR / flicker on decoded frames" if ecfg.decode else "no pixel metrics (decode off)")
    )
    return "\n".join(lines)
