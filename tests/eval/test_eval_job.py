"""The eval job under torchrun (python -m gc25d_core.jobs.eval): its cases shared among 2 ranks
give the very files of 1 rank, and a relaunch keeps the exports already evaluated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gc25d_core.config import write_resolved
from gc25d_core.eval.run import RESULTS_DIR, result_key
from gc25d_core.eval.spec import INPUT_FILE, EvalConfig, EvalInput, exports_of_handoff, write_model
from gc25d_core.eval.sweeps import Case
from gc25d_core.train.synthetic import random_teacher
from tests.eval.world import eval_world

ROOT = Path(__file__).resolve().parents[2]
# 2 clip28 cases and 1 chain241 case: 3 cases, so that each of 2 ranks rolls out some (n-th case of
# all sweeps on rank n % 2); decoded with the seeded tiny VAE, so PSNR and the strips are compared
# too; 8 cells per rollout keep 3 launches on a CPU within minutes
SPEC = EvalConfig(clip28_clips=2, chain241_chains=1, clip28_cells=8, chain241_cells=8, teacher_steps=2)
# what the job writes that must not depend on the number of ranks
COMPARED = ("table.md", "summary.json", "report.md", "eval_output.json")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_job")
    cfg = eval_world(root)
    # decode with the seeded random tiny VAE (the tiny preset's fitted one is the tiny_vae asset's)
    cfg = cfg.model_copy(
        update={"vae": cfg.vae.model_copy(update={"fit": cfg.vae.fit.model_copy(update={"enabled": False})})}
    )
    sft = exports_of_handoff("sft", random_teacher(cfg, root), root)
    stage1 = exports_of_handoff("stage1_tf", random_teacher(cfg, root, causal=True), root)
    spec = EvalInput(
        manifest_version=1, eval=SPEC, exports=sft + stage1, not_evaluated=["stage2_cd: no file"]
    )
    return root, cfg, spec


def run_job(cfg, run_dir: Path, spec: EvalInput, nproc: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    config = write_resolved(cfg, run_dir)
    write_model(run_dir, INPUT_FILE, spec)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "gc25d_core.jobs.eval", "--config", str(config), "--run-dir", str(run_dir)]
    # the same threads per rank in both runs: torchrun gives each of several ranks one thread, and
    # a CPU kernel's sums may group differently with more (a property of the thread count, not of
    # sharding)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def report_files(run_dir: Path) -> dict[str, bytes]:
    names = [*COMPARED, *(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*.png"))]
    names += [p.relative_to(run_dir).as_posix() for p in run_dir.glob("*/metrics.json")]
    return {n: (run_dir / n).read_bytes() for n in sorted(names)}


def test_two_ranks_write_the_files_of_one_and_a_relaunch_keeps_what_was_evaluated(world):
    root, cfg, spec = world
    one, two = root / "runs_eval" / "one", root / "runs_eval" / "two"
    run_job(cfg, one, spec, 1)
    run_job(cfg, two, spec, 2)
    first = report_files(one)
    assert {"sft/metrics.json", "stage1_tf/metrics.json", "chain241_latent_mse.png"} <= set(first)
    assert "sft/clip28_strip.png" in first and "chain241_psnr.png" in first  # decoded: pixel metrics
    doc = json.loads(first["stage1_tf/metrics.json"])
    assert doc["sweeps"]["clip28"]["num_cases"] == 2 and doc["sweeps"]["chain241"]["num_cases"] == 1
    assert report_files(two) == first

    # a relaunch: sft's kept result is taken as it is (marked here to tell), stage1_tf's missing one
    # is evaluated again, to the same bytes
    kept = one / RESULTS_DIR / "sft.json"
    held = json.loads(kept.read_text())
    held["result"]["sampler"]["kept"] = True
    kept.write_text(json.dumps(held))
    (one / RESULTS_DIR / "stage1_tf.json").unlink()
    (one / "stage1_tf" / "metrics.json").unlink()
    run_job(cfg, one, spec, 1)
    again = report_files(one)
    assert json.loads(again["sft/metrics.json"])["sampler"]["kept"] is True
    assert again["stage1_tf/metrics.json"] == first["stage1_tf/metrics.json"]
    assert again["sft/clip28_strip.png"] == first["sft/clip28_strip.png"]  # the kept strip


def test_a_kept_result_is_keyed_by_the_export_and_the_sweeps(world):
    """Another export file (its SHA256), another sweep setting or other cases: evaluated again."""
    _, cfg, spec = world
    export = spec.exports[0]
    cases: dict[str, list[Case]] = {"clip28": [], "chain241": []}
    key = result_key(cfg, spec, export, cases)
    assert key == result_key(cfg, spec, export, cases)
    other_sha = type(export)(export.label, export.path, "0" * 64, export.stage, export.step)
    assert result_key(cfg, spec, other_sha, cases) != key
    reseeded = spec.model_copy(update={"eval": spec.eval.model_copy(update={"seed": 1})})
    assert result_key(cfg, reseeded, export, cases) != key
    fewer_cells = spec.model_copy(update={"eval": spec.eval.model_copy(update={"clip28_cells": 20})})
    assert result_key(cfg, fewer_cells, export, cases) != key
    assert result_key(cfg, spec.model_copy(update={"manifest_version": 2}), export, cases) != key
