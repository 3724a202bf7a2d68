"""SPEC §10 evaluation per snapshot partition: every export of the chain that exists, on the clip28
and chain241 sweeps (gc25d_core.eval), with the plots and the comparison table in the metadata.

The asset finds the hand-offs, writes ``eval_input.json`` (gc25d_core.eval.spec) into its run folder
and launches ``python -m gc25d_core.jobs.eval`` through the ``torchrun`` resource: the ranks share
the cases, rank 0 writes the reports, and this step process loads no model. A retry keeps the
exports already evaluated. The metadata is read back from the files the job wrote.

``EVAL_SOURCES``: (label, upstream asset, hand-off file) in chain order, derived from the stage table
(a stage's ``evaluated``) with the deploy file last. A
hand-off with an EMA export gives ``<label>_ema`` (and ``<label>`` beside it with
``raw_beside_ema``); the deploy export (deploy_export's final.json) is one. Stage 3's EMA milestones join here the same way.
"""

import base64
import json
from pathlib import Path
from typing import NamedTuple

import dagster as dg
from pydantic import Field

from gc25d_core.eval.live import default_live_ceiling, default_live_sweeps
from gc25d_core.eval.report import ReportFiles
from gc25d_core.eval.spec import (
    INPUT_FILE,
    OUTPUT_FILE,
    EvalConfig,
    EvalExport,
    EvalInput,
    EvalOutput,
    exports_of_handoff,
    read_model,
    write_model,
)
from gc25d_core.eval.store import finished_eval
from gc25d_core.handoff import FINAL, runs_relative
from gc25d_core.schema import ConfigError
from gc25d_core.stages import STAGES
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.deploy.assets import deploy_export
from gc25d_pipeline.defs.train.assets import HANDOFF_WRITERS
from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.previews import eval_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.snapshots import published_snapshot
from gc25d_pipeline.lib.stage_assets import STAGE_RETRY_POLICY, run_folder_of


class EvalSource(NamedTuple):
    label: str
    asset: dg.AssetsDefinition
    file: str


# every evaluated stage of the table (gc25d_core.stages) by its hand-off, in chain order, then the deploy file
EVAL_SOURCES: tuple[EvalSource, ...] = (
    *(EvalSource(s.name, HANDOFF_WRITERS[s.name], s.handoff) for s in STAGES if s.evaluated),
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
    live_sweeps: list[str] | None = Field(
        default=None,
        description="live sessions scored against the code world (live240: 60 s, live2400: 10 min); "
        "default: live240 on a CPU preset (the embedded default), live2400 on a GPU one; [] skips them",
    )
    live_cells: int | None = Field(
        default=None, ge=2, description="shorten the live sessions to this many cells (a quick look, tests)"
    )
    live_ceiling: bool | None = Field(
        default=None,
        description="score the truth through the VAE beside the exports in the live sessions (what "
        "perfect latents would show, per segment); default: on for a GPU preset, off for the "
        "embedded default's CPU budget (one more decode of each session)",
    )
    raw_beside_ema: bool = Field(
        default=False,
        description="evaluate a stage's raw export beside its EMA export; default the EMA alone, the "
        "weights the deploy export takes (each export costs the eval as much as any other)",
    )


def available_exports(
    project: Gc25dProject, context: dg.AssetExecutionContext, raw_beside_ema: bool = False
) -> tuple[list[EvalExport], list[str]]:
    """The exports of the sources whose hand-off file exists for this partition, and what is skipped
    (the job leaves out a deploy copy of an export it evaluates too: gc25d_core.eval.run). A hand-off
    with an EMA export gives that one alone unless ``raw_beside_ema``."""
    cfg = project.config()
    exports: list[EvalExport] = []
    skipped: list[str] = []
    for src in EVAL_SOURCES:
        path = project.run_dir(cfg, run_folder_of(src.asset), context) / src.file
        if not path.is_file():
            skipped.append(f"{src.label}: no {runs_relative(path, cfg.paths.runs_root)}")
            continue
        try:
            found = exports_of_handoff(src.label, path, cfg.paths.runs_root)
        except ConfigError as e:
            raise dg.Failure(f"eval source {src.label}: {e}", allow_retries=False) from None
        if len(found) > 1 and not raw_beside_ema:  # [raw, EMA]
            skipped.append(f"{src.label}: its EMA export instead (raw_beside_ema: false)")
            found = found[1:]
        exports += [e.relative_to(cfg.paths.runs_root) for e in found]
    return exports, skipped


@dg.asset(
    name="eval",
    group_name="eval",
    partitions_def=cache_snapshots,
    deps=[src.asset for src in EVAL_SOURCES],
    kinds={"torch"},
    pool="gpu",
    tags={"gpu": "true"},
    retry_policy=STAGE_RETRY_POLICY,  # a retry keeps the exports already evaluated (results/)
    description="SPEC §10 eval sweep (clip28, chain241) of every export of the chain that exists for this "
    "snapshot, a torchrun job whose ranks share the cases. Its metadata starts with the comparison table "
    "and the drift plot, then what was measured and the whole report (every plot inline); the run folder "
    "holds report.md, the plots and per-export JSON.",
)
def eval_asset(
    context: dg.AssetExecutionContext, config: EvalRunConfig, project: Gc25dProject, torchrun: JobLauncher
) -> dg.MaterializeResult:
    cfg = project.config()
    version = published_snapshot(cfg, context.partition_key)
    exports, skipped = available_exports(project, context, config.raw_beside_ema)
    for line in skipped:
        context.log.info(f"not evaluated: {line}")  # each line says why
    if not exports:
        raise dg.Failure(f"no export to evaluate for {context.partition_key}: " + "; ".join(skipped))
    settings = config.model_dump(exclude={"raw_beside_ema"})  # the exports' choice, not the sweeps'
    if settings["live_sweeps"] is None:
        settings["live_sweeps"] = default_live_sweeps(cfg)
    if settings["live_ceiling"] is None:
        settings["live_ceiling"] = default_live_ceiling(cfg)
    ecfg = EvalConfig(**settings, teacher_window=cfg.timeline.num_cells)
    run_dir = project.run_dir(cfg, "eval", context)
    spec = EvalInput(manifest_version=version, eval=ecfg, exports=exports, not_evaluated=skipped)
    write_model(run_dir, INPUT_FILE, spec)
    if (done := finished_eval(cfg, run_dir)) is not None:  # the job would compute nothing
        context.log.info(
            f"eval: {run_dir} holds this evaluation (the same inputs, code and VAE); nothing to run"
        )
        launched = {"launched": False, "num_cases": dg.MetadataValue.json(done.num_cases)}
    else:
        mat = torchrun.launch(context, "gc25d_core.jobs.eval", cfg, run_dir).get_materialize_result()
        launched = dict(mat.metadata or {})
    return dg.MaterializeResult(metadata={**metadata_of_run(run_dir, spec), **launched})


def metadata_of_run(run_dir: Path, spec: EvalInput) -> dict[str, dg.MetadataValue]:
    """The asset's metadata (lib.previews.eval_metadata) from the files the eval job wrote."""
    done = read_model(run_dir, OUTPUT_FILE, EvalOutput)
    results = [json.loads((run_dir / label / "metrics.json").read_text()) for label in done.exports]
    files = ReportFiles(
        folder=run_dir,
        table=(run_dir / "table.md").read_text(),
        json_files={label: run_dir / label / "metrics.json" for label in done.exports},
        plots={name: (run_dir / name).read_bytes() for name in done.plots},
    )
    evaluated = [e for e in spec.exports if e.label in done.exports]
    measured = measured_markdown(spec.manifest_version, spec.eval, done.num_cases, evaluated)
    out = eval_metadata(files, results, measured, done.exports, done.not_evaluated)
    # the live sessions' table (printed by `make run` from table.md) and the computed / kept work
    live = (run_dir / "table.md").read_text().partition("\nlive")[2]
    if live:
        out["live_table"] = dg.MetadataValue.md("live" + live)
    drift = [n for n in done.plots if n.endswith("_drift.png")]
    if drift:  # each causal export's drift curve over the live session, inline
        out["drift"] = dg.MetadataValue.md(
            "\n\n".join(
                f"**{n.removesuffix('.png')}**\n\n![{n}](data:image/png;base64,"
                + base64.b64encode(files.plots[n]).decode()
                + ")"
                for n in drift
            )
        )
    # the job's own metadata adds "computed" (rollouts / cases computed per sweep by this run)
    out["kept_rows"] = dg.MetadataValue.json(done.kept)
    return out


def measured_markdown(
    version: int, ecfg: EvalConfig, num_cases: dict[str, int], exports: list[EvalExport]
) -> str:
    """What the table measures, in a few lines (the asset page shows it inline; report has the rest)."""
    sweeps = {
        "clip28": "28 cells from a val clip's cell 0, its own ids and prompts; ground truth cells 0–20",
        "chain241": "61 cells (241 frames) along a val run; ground truth where its clips have latents",
        "live240": "a 60 s scripted session in the code world per causal export, against its RGB truth",
        "live2400": "a 10 min scripted session in the code world per causal export, against its RGB truth",
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
