"""Factory of per-snapshot training-stage assets: each launches one torchrun job of a gc25d_core stage.

A stage asset resolves the project config, fills the stage's section from
``configs/<stage>/<preset>.yaml`` (``gc25d_core.train.presets.with_stage``), pins
``data.manifest_version`` to the snapshot of its partition and launches
``python -m gc25d_core.jobs.train --stage <stage>`` into ``<runs_root>/<asset name>/<partition>``. That folder is
fixed per (asset, partition), so a retry, a re-execution or a relaunch resumes from the job's latest
state; ``fresh`` starts over.

``init_from`` chains stages through hand-off files (``gc25d_core.handoff``): the upstream
asset's run folder for the same partition holds ``teacher.json`` (the SFT pick) or ``final.json``
(a stage's last export); the factory points the stage's ``model.handoff`` at that file and the job
reads the export it names, checking its SHA256. Nothing about the upstream run is re-derived here.
"""

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import dagster as dg
from pydantic import Field

from gc25d_core.config import Gc25dConfig, deep_merge
from gc25d_core.handoff import TEACHER, read_handoff
from gc25d_core.names import InvalidNameError, check_name
from gc25d_core.schema import ConfigError
from gc25d_core.stages import BY_NAME, Stage, Upstream
from gc25d_core.train.loop import TENSORBOARD_DIR, finished_run
from gc25d_core.train.metrics import JsonlLog, curves_png
from gc25d_core.train.presets import with_stage
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.clip_jobs import png_markdown
from gc25d_pipeline.lib.launcher import JobLauncher, summary_metadata
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.snapshots import published_snapshot

# Definition metadata naming the run folder (under the runs root) an asset's files live in: a stage
# asset's own name, or for sft_teacher the folder of the sft run it picks from. init_from reads it
# to find the upstream hand-off file.
RUN_FOLDER_KEY = "gc25d/run_folder"

# the one torchrun entry point of every stage (its --stage picks the table entry)
TRAIN_MODULE = "gc25d_core.jobs.train"

# A failed rank (lost node, OOM, preemption) is worth retrying: the job resumes from its run folder.
STAGE_RETRY_POLICY = dg.RetryPolicy(max_retries=3, delay=60, backoff=dg.Backoff.EXPONENTIAL)


class StageRunConfig(dg.Config):
    """What a launch of a stage asset may change; everything else comes from the stage preset."""

    stage_preset: str = Field(
        default="",
        description="configs/<stage>/<name>.yaml, a bare name (gc25d_core.names); empty: the project "
        "preset's name (tiny / v10)",
    )
    max_steps: int = Field(
        default=0, ge=0, description="stop at this optimizer step; 0: the stage preset's max_steps"
    )
    fresh: bool = Field(
        default=False,
        description="delete the run folder's state, exports and logs and start at step 0 (default: resume)",
    )


class HandoffSource(NamedTuple):
    """Where a stage's initial weights come from: ``file`` in ``asset``'s run folder, same partition."""

    asset: dg.AssetsDefinition
    file: str  # teacher.json (sft_teacher) or final.json (any stage)
    export: Literal["export", "ema"] = "export"  # which export of the hand-off file


def run_folder_of(asset: dg.AssetsDefinition) -> str:
    """The run folder name ``asset`` declares in its definition metadata (RUN_FOLDER_KEY)."""
    folder = asset.metadata_by_key.get(asset.key, {}).get(RUN_FOLDER_KEY)
    if not isinstance(folder, str):
        raise ValueError(
            f"asset {asset.key.to_user_string()} declares no {RUN_FOLDER_KEY!r} metadata: it has no run "
            "folder a hand-off file could be read from (build it with stage_asset, or declare it)"
        )
    return folder


def handoff_path(
    project: Gc25dProject, cfg: Gc25dConfig, source: HandoffSource, context: dg.AssetExecutionContext
) -> Path:
    """The upstream hand-off file of this partition, checked now (present, valid, has the export asked
    for) so that a missing or broken one fails at once instead of in every rank after a launch."""
    upstream = source.asset.key.to_user_string()
    path = project.run_dir(cfg, run_folder_of(source.asset), context) / source.file
    if not path.is_file():
        raise dg.Failure(
            f"hand-off file {path} does not exist: materialize {upstream} for partition "
            f"{context.partition_key} first (init_from of {context.asset_key.to_user_string()})",
            allow_retries=False,
        )
    try:
        read_handoff(path, cfg.paths.runs_root).pick(source.export)
    except ConfigError as e:
        raise dg.Failure(f"init_from {upstream}: {e}", allow_retries=False) from None
    return path


def as_configured(path: Path, runs_root: Path) -> Path:
    """``path`` (absolute, under the runs root) spelled from the runs root as the config names it: a
    relative runs root gives a relative path, so the resolved config.yaml a run folder keeps names
    no checkout (the jobs run from the same folder as the code location, like every relative path)."""
    return Path(runs_root) / path.relative_to(os.path.abspath(runs_root))


# (the run folder, its resolved config, the run log) -> metadata; must not raise (a preview is
# decoration: the training result stands without it)
StagePreviews = Callable[[Path, Gc25dConfig, dg.DagsterLogManager], dict[str, dg.MetadataValue]]


def stage_asset(
    name: str,
    stage: str,
    *,
    deps: Sequence[dg.AssetsDefinition | str] = (),
    module: str | None = None,
    init_from: HandoffSource | tuple[dg.AssetsDefinition, str, Literal["export", "ema"]] | None = None,
    real_from: HandoffSource | tuple[dg.AssetsDefinition, str, Literal["export", "ema"]] | None = None,
    description: str | None = None,
    partitions_def: dg.PartitionsDefinition = cache_snapshots,
    pool: str = "gpu",
    tags: Mapping[str, str] | None = None,
    retry_policy: dg.RetryPolicy | None = STAGE_RETRY_POLICY,
    kinds: Sequence[str] = ("torch",),
    group_name: str = "train",
    previews: StagePreviews | None = None,
) -> dg.AssetsDefinition:
    """A training-stage asset ``name`` running core stage ``stage`` (its section of the run config,
    presets in configs/<stage>/) through ``python -m <module> --stage <stage>`` (default
    gc25d_core.jobs.train, the entry point of every stage in gc25d_core.stages).

    ``init_from`` (upstream asset, hand-off file name, "export" | "ema") sets ``model.init: handoff``
    and ``model.handoff`` to that file in the upstream's run folder for the same partition; the
    upstream becomes a dependency. ``real_from`` does the same for the section's ``real`` model (stage
    3's real score and critic init). Definition errors (unknown stage, missing entry module, a
    hand-off name that is not a file name, an upstream without a run folder or on other partitions)
    raise ValueError when the code location loads. ``previews`` adds metadata drawn from the
    finished run folder (videos, plots) to the launch's summary."""
    check_name(name, "stage asset name")
    if stage not in BY_NAME:
        raise ValueError(
            f"stage asset {name}: stage={stage!r} is not a core stage (known: {sorted(BY_NAME)})"
        )
    module = module or TRAIN_MODULE
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"stage asset {name}: module={module!r} (the torchrun entry point) does not exist")
    # section field -> where its weights come from
    sources = {
        field: HandoffSource(*src)
        for field, src in (("model", init_from), ("real", real_from))
        if src is not None
    }
    all_deps = list(deps)
    for field, source in sources.items():
        upstream = source.asset.key.to_user_string()
        what = "init_from" if field == "model" else "real_from"
        try:
            check_name(source.file, f"{what} file of {name}")
        except InvalidNameError as e:
            raise ValueError(str(e)) from None
        if source.export not in ("export", "ema"):
            raise ValueError(f"stage asset {name}: {what} export={source.export!r} (export | ema)")
        if source.asset.partitions_def != partitions_def:
            raise ValueError(
                f"stage asset {name}: {what} {upstream} is partitioned by "
                f"{source.asset.partitions_def}, not {partitions_def}: its hand-off is read for the same key"
            )
        run_folder_of(source.asset)  # fail at load, not at the first launch
        if not any(_key_of(d) == source.asset.key for d in all_deps):
            all_deps.append(source.asset)
    metadata: dict[str, Any] = {RUN_FOLDER_KEY: name, "gc25d/stage": stage, "gc25d/entry_module": module}
    for field, source in sources.items():
        what = "init_from" if field == "model" else "real_from"
        metadata[f"gc25d/{what}"] = f"{source.asset.key.to_user_string()}: {source.file} ({source.export})"

    @dg.asset(
        name=name,
        group_name=group_name,
        partitions_def=partitions_def,
        deps=all_deps,
        kinds=set(kinds),
        pool=pool,
        tags=dict(tags) if tags is not None else {"gpu": "true"},
        retry_policy=retry_policy,
        description=description,
        metadata=metadata,
    )
    def _asset(
        context: dg.AssetExecutionContext,
        config: StageRunConfig,
        project: Gc25dProject,
        torchrun: JobLauncher,
    ) -> dg.MaterializeResult:
        base = project.config()
        # checked before launch: a partition without its snapshot cannot train, on any retry
        version = published_snapshot(base, context.partition_key)
        # the project's overrides of this stage's section (GC25D_OVERRIDES="stage3_dmd.max_steps=100")
        # go over its preset file, the snapshot and the hand-offs over both
        overrides = deep_merge(project.stage_overrides(stage), {"data": {"manifest_version": version}})
        handoffs = {}
        for field, source in sources.items():
            handoffs[field] = handoff_path(project, base, source, context)
            hand_off = {
                "init": "handoff",
                "handoff": str(as_configured(handoffs[field], base.paths.runs_root)),
                "handoff_export": source.export,
            }
            overrides = deep_merge(overrides, {field: hand_off})
        try:
            cfg = with_stage(base, stage, config.stage_preset or base.name, overrides)
        except ConfigError as e:  # a bad preset name or section: the same on every retry
            raise dg.Failure(f"{name}: {e}", allow_retries=False) from None
        run_dir = project.run_dir(cfg, name, context)
        args = (
            ["--stage", stage]
            + (["--max-steps", str(config.max_steps)] if config.max_steps else [])
            + (["--fresh"] if config.fresh else [])
        )
        done = None if config.fresh else finished_run(cfg, stage, run_dir, config.max_steps or None)
        if done is not None:  # the job would resume it and stop at once: no launch
            context.log.info(
                f"{name}: {run_dir} finished at step {done[0]['final_step']} with this config; nothing to train"
            )
            mat = dg.MaterializeResult(
                metadata={"launched": False, **summary_metadata(done[0])},
                data_version=dg.DataVersion(done[1]),
            )
        else:
            mat = torchrun.launch(context, module, cfg, run_dir, args).get_materialize_result()
        # the launch's summary, the run's curves, its previews, and which hand-off files it started from
        launched = {
            **(mat.metadata or {}),
            **curves_metadata(run_dir),
            **(previews(run_dir, cfg, context.log) if previews is not None else {}),
        }
        for f, p in handoffs.items():
            launched["init_handoff" if f == "model" else f"{f}_handoff"] = dg.MetadataValue.path(str(p))
        return dg.MaterializeResult(metadata=launched, data_version=mat.data_version)

    return _asset


def table_assets(
    stages: Sequence[Stage],
    *,
    picks: Mapping[str, dg.AssetsDefinition],
    first_deps: Sequence[dg.AssetsDefinition | str] = (),
    previews: Mapping[str, StagePreviews] | None = None,
) -> tuple[dict[str, dg.AssetsDefinition], dict[str, dg.AssetsDefinition]]:
    """One stage asset per table entry (gc25d_core.stages), named after its stage, in table order.

    An entry's ``init_from`` / ``real_from`` become hand-off sources: the asset that writes the
    upstream stage's hand-off file, i.e. the stage asset itself for ``final.json`` or, for
    ``teacher.json``, the pick asset in ``picks`` (stage name -> asset). A stage without
    ``init_from`` starts from the training cache: ``first_deps``. Returns (stage -> its asset,
    stage -> the asset that writes its hand-off file)."""
    built: dict[str, dg.AssetsDefinition] = {}
    writers: dict[str, dg.AssetsDefinition] = {}

    def source(up: Upstream | None) -> HandoffSource | None:
        if up is None:
            return None
        return HandoffSource(writers[up.stage], BY_NAME[up.stage].handoff, up.export)

    for s in stages:
        built[s.name] = stage_asset(
            s.name,
            s.name,
            deps=() if s.init_from is not None else first_deps,
            init_from=source(s.init_from),
            real_from=source(s.real_from),
            kinds=s.kinds,
            description=s.description,
            previews=(previews or {}).get(s.name),
        )
        if s.handoff == TEACHER:
            if s.name not in picks:
                raise ValueError(
                    f"stage {s.name} hands off by {TEACHER}, but no pick asset writes it (picks)"
                )
            writers[s.name] = picks[s.name]
        else:
            writers[s.name] = built[s.name]
    return built, writers


def curves_metadata(run_dir: Path) -> dict[str, Any]:
    """The run's curves as a PNG (gc25d_core.train.metrics.curves_png) and where its TensorBoard
    event files are (``tensorboard --logdir`` on that folder or any folder above it)."""
    train = JsonlLog(run_dir / "metrics.jsonl", enabled=False).records()
    val = JsonlLog(run_dir / "val.jsonl", enabled=False).records()
    md: dict[str, Any] = {}
    if (png := curves_png(train, val)) is not None:
        md["curves"] = png_markdown(png, "training curves")
    if (run_dir / TENSORBOARD_DIR).is_dir():
        md["tensorboard"] = dg.MetadataValue.path(str(run_dir / TENSORBOARD_DIR))
    return md


def _key_of(dep: dg.AssetsDefinition | str) -> dg.AssetKey:
    return dep.key if isinstance(dep, dg.AssetsDefinition) else dg.AssetKey.from_user_string(dep)
