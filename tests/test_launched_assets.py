"""deploy_export and eval run as torchrun jobs: materialized in a fresh process (the Dagster step
process of an in-process run) over a real tiny hand-off chain, that process never imports the model
code, the deploy export nor the evaluation; the jobs do, and their results reach the metadata.

The step process does import torch (the training config and hand-off modules bring it): what must
stay out is what loads weights or builds a model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gc25d_core.handoff import FINAL, TEACHER
from gc25d_core.train.synthetic import random_teacher
from tests.eval.world import eval_world

ROOT = Path(__file__).resolve().parents[1]
# modules that load weights, build a model or evaluate: only the jobs may import them
HEAVY = ("gc25d_core.models", "gc25d_core.eval.evaluate", "gc25d_core.eval.samplers", "gc25d_core.deploy")

STEP = """
import json, sys
import dagster as dg
from gc25d_pipeline.defs.deploy.assets import deploy_export
from gc25d_pipeline.defs.eval.assets import eval_asset
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

args = json.loads(sys.argv[1])
project = Gc25dProject(
    preset="tiny",
    overrides=[f"cache.store={args['store']}"],
    store=ArtifactStore(data_root=args["data"], runs_root=args["runs"]),
)
eval_config = {"clip28_clips": 1, "chain241_chains": 0, "teacher_steps": 1, "decode": False, "live_sweeps": []}
with dg.instance_for_test() as instance:
    instance.add_dynamic_partitions("cache_snapshots", ["v000001"])

    def materialize():
        return dg.materialize(
            [deploy_export, eval_asset],
            partition_key="v000001",
            instance=instance,
            resources={"project": project, "torchrun": TorchrunLauncher()},
            run_config={"ops": {"eval": {"config": eval_config}}},
            raise_on_error=False,
        )

    result = materialize()
    (md,) = [m.metadata for m in result.asset_materializations_for_node("eval")] or [{}]
    again = materialize()  # nothing changed: neither job is launched
    relaunched = {
        name: [m.metadata["launched"].value for m in again.asset_materializations_for_node(name)]
        for name in ("deploy_export", "eval")
    }
    print(json.dumps({
        "success": result.success,
        "checks": [(c.check_name, c.passed) for c in result.get_asset_check_evaluations()],
        "exports": md["exports"].value if "exports" in md else None,
        "not_evaluated": md["not_evaluated"].value if "not_evaluated" in md else None,
        "table": [r.data["export"] for r in md["table"].records] if "table" in md else None,
        "modules": sorted(m for m in sys.modules if m.startswith(tuple(args["heavy"]))),
        "torch": "torch" in sys.modules,
        "again": again.success,
        "relaunched": relaunched,
    }))
"""


def test_the_step_process_imports_no_model_code_for_deploy_export_and_eval(tmp_path):
    cfg = eval_world(tmp_path)  # runs root = tmp_path: hand-offs name exports inside it
    runs = Path(cfg.paths.runs_root)
    made = {
        ("sft", TEACHER): random_teacher(cfg, tmp_path),
        ("stage1_tf", FINAL): random_teacher(cfg, tmp_path, causal=True),
        ("stage3_dmd", FINAL): random_teacher(cfg, tmp_path, seed=3, causal=True, stage="stage3_dmd"),
    }
    for (folder, name), handoff in made.items():  # the upstream assets' run folders of partition v000001
        (runs / folder / "v000001").mkdir(parents=True, exist_ok=True)
        shutil.copy(handoff, runs / folder / "v000001" / name)
    args = {"store": str(cfg.cache.store), "data": str(cfg.paths.data_root), "runs": str(runs)}
    step = [sys.executable, "-c", STEP, json.dumps({**args, "heavy": HEAVY})]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(step, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["success"], proc.stderr[-6000:]
    assert out["modules"] == [], f"the step process imported {out['modules']}"
    assert out["checks"] == [["deploy_contract", True]]
    # stage 3's EMA alone (raw_beside_ema off), and the deploy file is that EMA: eval reports it
    # as that export's copy, not twice
    assert out["exports"] == ["sft", "stage1_tf", "stage3_dmd_ema"] == out["table"]
    assert "stage3_dmd: its EMA export instead (raw_beside_ema: false)" in out["not_evaluated"]
    assert "deploy: the same weights as stage3_dmd_ema (its deploy copy)" in out["not_evaluated"]
    assert any(s.startswith("stage2_cd: no ") for s in out["not_evaluated"])
    assert (runs / "deploy_export" / "v000001" / "deploy.safetensors").is_file()
    assert (runs / "eval" / "v000001" / "stage3_dmd_ema" / "metrics.json").is_file()
    assert out["again"] and out["relaunched"] == {"deploy_export": [False], "eval": [False]}
