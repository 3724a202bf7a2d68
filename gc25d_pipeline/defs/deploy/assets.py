"""The deploy export per snapshot partition, between stage 3 and the evaluation.

``deploy_export`` writes ``deploy.safetensors`` (gc25d_core.deploy.export: the stage-3 EMA export by
default, or any causal export the launch names, with its causal metadata and the chain of init
checkpoints) and a ``final.json`` hand-off in its run folder, which eval (and ``make play``) read.
Its check ``deploy_contract`` loads the file through the runtime's own loader
(gc25d_core.deploy.runtime.load_deploy_model) and checks the SPEC §8 contract: causal, 4 steps,
sink 3 / window 17 / RoPE cap 20, bf16, 831 keys at full size, the vocabulary of the project.
"""

import json
from typing import Literal

import dagster as dg
from pydantic import Field

from gc25d_core.handoff import FINAL, handoff_of, read_handoff, write_handoff_file
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.train.assets import stage1_tf, stage2_cd, stage3_dmd
from gc25d_pipeline.lib.project import Gc25dProject
from gc25d_pipeline.lib.stage_assets import RUN_FOLDER_KEY, run_folder_of

SOURCES = {a.key.to_user_string(): a for a in (stage3_dmd, stage2_cd, stage1_tf)}


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
    deps=[stage3_dmd],
    kinds={"python"},
    metadata={RUN_FOLDER_KEY: "deploy_export"},
    check_specs=[dg.AssetCheckSpec("deploy_contract", asset="deploy_export")],
    description="The SPEC §6 deploy file of this snapshot's stage-3 EMA (or a picked causal export), "
    "with the causal metadata and the init chain; checked through the runtime's loader.",
)
def deploy_export(
    context: dg.AssetExecutionContext, config: DeployExportConfig, project: Gc25dProject
) -> dg.MaterializeResult:
    from gc25d_core.deploy.export import write_deploy_export
    from gc25d_core.deploy.runtime import contract_problems, load_deploy_model
    from gc25d_core.models.export import ExportError
    from gc25d_core.schema import ConfigError

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
    out = run_dir / "deploy.safetensors"
    try:
        summary = write_deploy_export(source, out, expected_sha256=sha, runs_root=cfg.paths.runs_root)
        model, meta = load_deploy_model(out, vocab=cfg.vocab, expected_sha256=summary["sha256"])
    except (ExportError, ValueError) as e:
        raise dg.Failure(f"deploy_export from {label}: {e}", allow_retries=False) from None
    num_keys = len(model.state_dict())
    problems = contract_problems(meta, num_keys)
    del model
    step = int(meta.extra.get("step", "0") or 0)
    write_handoff_file(run_dir / FINAL, handoff_of("deploy", step, out, runs_root=cfg.paths.runs_root))
    check = dg.AssetCheckResult(
        check_name="deploy_contract",
        passed=not problems,
        metadata={
            "problems": problems,
            "keys": num_keys,
            "vocab": meta.vocab,
            "causal": json.dumps(meta.causal.model_dump() if meta.causal else None),
            "denoise_axis": json.dumps(list(meta.denoise_axis or ())),
        },
    )
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(out)),
            "sha256": summary["sha256"],
            "source": label,
            "source_path": dg.MetadataValue.path(source),
            "init_chain": dg.MetadataValue.json(summary["init_chain"]),
            "keys": num_keys,
        },
        data_version=dg.DataVersion(summary["sha256"][:16]),
        check_results=[check],
    )
