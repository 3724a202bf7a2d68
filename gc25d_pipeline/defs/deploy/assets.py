"""The deploy export per snapshot partition, between stage 3 and the evaluation.

``deploy_export`` launches ``python -m gc25d_core.jobs.deploy_export`` (one rank, through the
``torchrun`` resource), which writes ``deploy.safetensors`` (gc25d_core.deploy.export: the stage-3
EMA export by default, or any causal export the launch names, with its causal metadata and the
chain of init checkpoints) and a ``final.json`` hand-off in its run folder, which eval (and ``make
play``) read. The job loads the file through the runtime's own loader
(gc25d_core.deploy.runtime.load_deploy_model) and checks the SPEC §8 contract (causal, 4 steps,
sink 3 / window 17 / RoPE cap 20, bf16, 831 keys at full size, the vocabulary of the project); its
``deploy.json`` gives the check ``deploy_contract`` and the metadata. This step loads no model.
"""

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import to_yaml
from gc25d_core.handoff import FINAL, read_handoff
from gc25d_core.hashing import file_identities
from gc25d_core.schema import ConfigError
from gc25d_core.stages import STAGES
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.train.assets import STAGE_ASSETS
from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.stage_assets import RUN_FOLDER_KEY, STAGE_RETRY_POLICY, run_folder_of

# the stages whose final.json the deploy file may take: the table's feeds_deploy
SOURCES = {s.name: STAGE_ASSETS[s.name] for s in reversed(STAGES) if s.feeds_deploy}


class DeployExportConfig(dg.Config):
    source: Literal["stage3_dmd", "stage2_cd", "stage1_tf"] = Field(
        default="stage3_dmd", description="the stage whose final.json names the export (same partition)"
    )
    which: Literal["ema", "export"] = Field(default="ema", description="the hand-off's EMA or plain export")
    export_path: str = Field(default="", description="any causal export instead (overrides source)")
    export_sha256: str = Field(default="", description="its SHA256 (required with export_path)")


@dg.asset(
    name="deploy_export",
    group_name="deploy",
    partitions_def=cache_snapshots,
    deps=[STAGE_ASSETS["stage3_dmd"]],
    kinds={"torch"},
    retry_policy=STAGE_RETRY_POLICY,
    metadata={RUN_FOLDER_KEY: "deploy_export"},
    check_specs=[dg.AssetCheckSpec("deploy_contract", asset="deploy_export")],
    description="The SPEC §6 deploy file of this snapshot's stage-3 EMA (or a picked causal export), "
    "with the causal metadata and the init chain; checked through the runtime's loader.",
)
def deploy_export(
    context: dg.AssetExecutionContext,
    config: DeployExportConfig,
    project: Gc25dProject,
    torchrun: JobLauncher,
) -> dg.MaterializeResult:
    cfg = project.config()
    if config.export_path:
        if not config.export_sha256:
            raise dg.Failure("export_path needs export_sha256 (the file is checked)", allow_retries=False)
        source, sha, label = config.export_path, config.export_sha256, "export_path"
    else:
        asset = SOURCES[config.source]
        handoff = project.run_dir(cfg, run_folder_of(asset), context) / FINAL
        if not handoff.is_file():
            raise dg.Failure(
                f"hand-off {handoff} does not exist: materialize {config.source} for {context.partition_key} first",
                allow_retries=False,
            )
        try:
            path, sha = read_handoff(handoff, cfg.paths.runs_root).pick(config.which)
        except ConfigError as e:
            raise dg.Failure(f"deploy_export: {e}", allow_retries=False) from None
        source, label = str(path), f"{config.source} ({config.which})"
    run_dir = project.run_dir(cfg, "deploy_export", context)
    out, summary_file = run_dir / "deploy.safetensors", run_dir / "deploy.json"
    args = [
        "--source",
        source,
        "--sha256",
        sha,
        "--label",
        label,
        "--out",
        str(out),
        "--summary",
        str(summary_file),
    ]
    # the same source, label and config as the files there: no launch (the source by its SHA256,
    # not by its path: the record pins no checkout)
    record = {
        "source_sha256": sha,
        "label": label,
        "config_sha256": hashlib.sha256(to_yaml(cfg).encode()).hexdigest(),
    }
    launched = not same_export(run_dir, record, [out, summary_file])
    if launched:
        one_rank = torchrun.model_copy(update={"nproc_per_node": 1, "nnodes": 1})  # one file to write
        one_rank.launch(context, "gc25d_core.jobs.deploy_export", cfg, run_dir, args)
        keep_export(run_dir, record, [out, summary_file])
    else:
        context.log.info(f"deploy_export: {out} is the export of {label} with these settings; nothing to run")
    summary = json.loads(summary_file.read_text())
    check = dg.AssetCheckResult(
        check_name="deploy_contract",
        passed=not summary["problems"],
        metadata={
            "problems": summary["problems"],
            "keys": summary["keys"],
            "vocab": summary["vocab"],
            "causal": json.dumps(summary["causal"]),
            "denoise_axis": json.dumps(summary["denoise_axis"]),
        },
    )
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(out)),
            "sha256": summary["sha256"],
            "source": label,
            "source_path": dg.MetadataValue.path(source),
            "init_chain": dg.MetadataValue.json(summary["init_chain"]),
            "keys": summary["keys"],
            "launched": launched,
        },
        data_version=dg.DataVersion(summary["sha256"][:16]),
        check_results=[check],
    )


EXPORT_RECORD = "deploy_export_done.json"  # what the files of a finished launch came from


def _by_name(files: list[Path]) -> dict[str, list[int]]:
    return {Path(p).name: v for p, v in file_identities(files).items()}


def keep_export(run_dir: Path, record: dict[str, Any], files: list[Path]) -> None:
    atomic_write_text(run_dir / EXPORT_RECORD, json.dumps({**record, "files": _by_name(files)}))


def same_export(run_dir: Path, record: dict[str, Any], files: list[Path]) -> bool:
    """The files in ``run_dir`` are those a launch with ``record`` (source, label, config) left."""
    try:
        kept = json.loads((run_dir / EXPORT_RECORD).read_text())
        return kept == {**record, "files": _by_name(files)}
    except (OSError, ValueError):
        return False
