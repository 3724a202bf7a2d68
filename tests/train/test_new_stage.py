"""Adding a stage is one table entry, one math file and its presets (docs/architecture.md, "Adding a
stage"). In a copy of the repository's packages, a toy stage (the plain velocity MSE at t = 500 over
the shared ``DenoiserRun``) gets exactly those three edits and nothing else; then, from that copy, it
trains through the one entry point (``python -m gc25d_core.jobs.train --stage``, torchrun, 2 CPU
ranks), a run killed mid-way resumes bit-identically, and the code location has it as an asset
downstream of its hand-off (the teacher pick), in the chain job and among eval's sources."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.resume_checks import ROOT, assert_same_tensors, launch, records

pytestmark = pytest.mark.slow

COPIED = ("gc25d_core", "gc25d_pipeline", "configs", "pyproject.toml")
TABLE = "gc25d_core/stages.py"
END_OF_TABLE = "\n)\n\n\ndef check_table("  # the entry goes last in STAGES

ENTRY = """    Stage(
        "toy_mse",
        StageConfig,
        "gc25d_core.train.toy_mse:ToyRun",
        "A toy stage: the plain velocity MSE at t=500 from the picked teacher.",
        init_from=Upstream("sft"),
        kinds=("torch",),
    ),"""

MATH = '''"""A toy stage: the plain velocity MSE at t = 500 over the shared DenoiserRun."""

import torch

from gc25d_core.train.data import TrainingSample, batch_of
from gc25d_core.train.denoiser import DenoiserRun, MicroLoss
from gc25d_core.train.inputs import ti2v_inputs


class ToyRun(DenoiserRun):
    name = "toy_mse"

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        t = 500.0
        latent, ids = batch_of([s.latent for s in samples]), batch_of([s.ids for s in samples])
        _, x_t, target = ti2v_inputs(self.schedule, latent, t, gen, self.device)
        pred = self.model(**self.kwargs(x_t, t, [s.keys for s in samples], ids), **self.checkpointing())
        mse = (pred.float() - target).pow(2).mean()
        return MicroLoss(mse, mse, t)
'''

PRESET = """# The toy stage on the tiny preset: CPU, fp32, DDP, from the picked teacher.
engine: torch
precision: fp32
micro_batch: 1
grad_accum: 1
max_steps: 4
export_every: 2
state_every: 2
deterministic: true
data_tag: codeworld
model:
  preset: tiny
  init: handoff
  handoff: null
  gradient_checkpointing: false
optim:
  lr: 1.0e-4
  cond_lr: null
  warmup_steps: 2
data:
  num_workers: 0
val:
  every: 2
  num_clips: 2
"""

# run in the copy: the tiny world (tests.train.world's), a random teacher's teacher.json as the
# hand-off, the toy section from its preset
WORLD = """
import sys
from pathlib import Path
from gc25d_core.config import write_resolved
from gc25d_core.train.presets import with_stage
from gc25d_core.train.synthetic import random_teacher, sft_world
root = Path(sys.argv[1])
cfg = sft_world(root)
cfg = with_stage(cfg, "toy_mse", "tiny", {"model": {"handoff": str(random_teacher(cfg, root))}})
write_resolved(cfg, root, "run.yaml")
"""

GRAPH = """
import json
import dagster as dg
from gc25d_pipeline.definitions import defs
from gc25d_pipeline.defs.eval.assets import EVAL_SOURCES
key = dg.AssetKey("toy_mse")
node = defs.resolve_asset_graph().get(key)
chain = defs.resolve_job_def("distill_chain_job").asset_layer.selected_asset_keys
md = defs.resolve_assets_def(key).metadata_by_key[key]
print(json.dumps({
    "parents": sorted(p.to_user_string() for p in node.parent_keys),
    "in_chain": key in chain,
    "eval": [(s.label, s.asset.key.to_user_string(), s.file) for s in EVAL_SOURCES],
    "init_from": md["gc25d/init_from"],
}))
"""


def _copy_with_the_toy_stage(dst: Path) -> Path:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst / name)
    table = dst / TABLE
    text = table.read_text()
    assert text.count(END_OF_TABLE) == 1, f"{TABLE}: the end of STAGES is not where this test inserts"
    table.write_text(text.replace(END_OF_TABLE, "\n" + ENTRY + END_OF_TABLE))
    (dst / "gc25d_core" / "train" / "toy_mse.py").write_text(MATH)
    (dst / "configs" / "toy_mse").mkdir()
    (dst / "configs" / "toy_mse" / "tiny.yaml").write_text(PRESET)
    return dst


def _python(code: str, root: Path, *args: str) -> str:
    import os

    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    repo = _copy_with_the_toy_stage(tmp_path_factory.mktemp("repo"))
    world = tmp_path_factory.mktemp("world")
    _python(WORLD, repo, str(world))
    return repo, world


def _train(repo: Path, world: Path, run_dir: Path, fault: str | None = None):
    argv = ["-m", "gc25d_core.jobs.train", "--stage", "toy_mse", "--config", str(world / "run.yaml")]
    return launch([*argv, "--run-dir", str(run_dir)], nproc=2, fault=fault, root=repo)


def test_the_toy_stage_trains_and_resumes_through_the_entry_point(toy):
    repo, world = toy
    full = _train(repo, world, world / "full")
    assert full.returncode == 0, full.stderr[-4000:]
    curve = records(world / "full" / "metrics.jsonl")
    assert [r["step"] for r in curve] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in curve)
    handoff = json.loads((world / "full" / "final.json").read_text())
    assert handoff["stage"] == "toy_mse" and handoff["step"] == 4

    killed = _train(repo, world, world / "resumed", fault="rank=1,step=4,mode=exit")
    assert killed.returncode != 0
    resumed = _train(repo, world, world / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stdout and "step 2" in resumed.stdout
    assert records(world / "resumed" / "metrics.jsonl") == curve
    slot = "state/step-000004"
    assert assert_same_tensors(world / "full" / slot, world / "resumed" / slot, "*.pt") > 0
    assert assert_same_tensors(world / "full" / "exports", world / "resumed" / "exports", "*.safetensors") > 0


def test_the_toy_stage_is_an_asset_after_its_handoff_and_in_the_chain_job(toy):
    repo, _ = toy
    graph = json.loads(_python(GRAPH, repo).strip().splitlines()[-1])
    assert graph["parents"] == ["sft_teacher"]
    assert graph["init_from"] == "sft_teacher: teacher.json (export)"
    assert graph["in_chain"]
    assert ["toy_mse", "toy_mse", "final.json"] in graph["eval"]
