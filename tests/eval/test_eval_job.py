"""The eval job under torchrun (python -m gc25d_core.jobs.eval): its cases (the live rollouts too)
shared among 2 ranks give the very files of 1 rank, and a relaunch keeps the rows already evaluated."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gc25d_core.config import write_resolved
from gc25d_core.eval.run import clip_sweep_doc
from gc25d_core.eval.spec import INPUT_FILE, EvalConfig, EvalInput, exports_of_handoff, write_model
from gc25d_core.eval.store import STORE_DIR, ResultStore, code_version, context_doc, row_key
from gc25d_core.eval.sweeps import Case
from gc25d_core.train.synthetic import random_teacher
from tests.eval.world import eval_world, with_random_vae

ROOT = Path(__file__).resolve().parents[2]
# 2 clip28 cases and 1 chain241 case: 3 cases, so that each of 2 ranks rolls out some (n-th case of
# all sweeps on rank n % 2); decoded with the seeded tiny VAE, so PSNR and the strips are compared
# too; 8 cells per rollout keep 3 launches on a CPU within minutes;
# too; a 6-cell live session of the causal export (its 3 rollouts shared by the ranks)
SPEC = EvalConfig(
    clip28_clips=2,
    chain241_chains=1,
    clip28_cells=8,
    chain241_cells=8,
    teacher_steps=2,
    live_sweeps=["live240"],
    live_cells=6,
)
# what the job writes that must not depend on the number of ranks
COMPARED = ("table.md", "summary.json", "report.md", "eval_output.json")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_job")
    cfg = with_random_vae(eval_world(root))
    sft = exports_of_handoff("sft", random_teacher(cfg, root), root)
    stage1 = exports_of_handoff("stage1_tf", random_teacher(cfg, root, causal=True), root)
    # as the eval asset writes them: named relative to the runs root
    exports = [e.relative_to(cfg.paths.runs_root) for e in sft + stage1]
    assert not any(e.path.is_absolute() for e in exports)
    spec = EvalInput(manifest_version=1, eval=SPEC, exports=exports, not_evaluated=["stage2_cd: no file"])
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
    store = root / STORE_DIR
    run_job(cfg, one, spec, 1)
    shutil.rmtree(store)  # the second launch computes every row again, on 2 ranks
    run_job(cfg, two, spec, 2)
    first = report_files(one)
    assert {"sft/metrics.json", "stage1_tf/metrics.json", "chain241_latent_mse.png"} <= set(first)
    assert "sft/clip28_strip.png" in first and "chain241_psnr.png" in first  # decoded: pixel metrics
    assert "stage1_tf/live240_drift.png" in first and "sft/live240_drift.png" not in first  # causal only
    doc = json.loads(first["stage1_tf/metrics.json"])
    assert doc["sweeps"]["clip28"]["num_cases"] == 2 and doc["sweeps"]["chain241"]["num_cases"] == 1
    assert doc["sweeps"]["live240"]["action"]["cells_before_that_differ"] == 0  # causal
    assert report_files(two) == first
    for name in ("eval_input.json", "summary.json", "stage1_tf/metrics.json", "sft/metrics.json"):
        assert str(root) not in (one / name).read_text(), f"{name} names the runs root's absolute path"
    out = json.loads((two / "eval_output.json").read_text())
    assert out["computed"] == {"clip28": 4, "chain241": 2, "live240": 3} and out["kept"] == []
    # the table opens with the numerics its rows were computed under (one record: one line)
    head = (one / "table.md").read_text().splitlines()[0]
    assert head.startswith("numerics: ") and "MKL_CBWR=AVX2,STRICT" in head and "1 threads a rank" in head
    assert doc["numerics"]["live240"]["pins"]["MKL_CBWR"] == "AVX2,STRICT"

    # a relaunch: the teacher's kept rows are taken as they are (marked here to tell), the causal
    # export's missing ones are evaluated again, to the same bytes
    for path in store.glob("*.json"):
        row = json.loads(path.read_text())
        if row["sampler"]["kind"] == "teacher":
            row["sampler"]["kept"] = True
            row["numerics"] = {**row["numerics"], "cpu": "Another CPU"}  # as if computed on another box
            path.write_text(json.dumps(row))
        else:
            path.unlink()
    (one / "stage1_tf" / "metrics.json").unlink()
    run_job(cfg, one, spec, 1)
    again = report_files(one)
    assert json.loads(again["sft/metrics.json"])["sampler"]["kept"] is True
    assert again["stage1_tf/metrics.json"] == first["stage1_tf/metrics.json"]
    assert again["sft/clip28_strip.png"] == first["sft/clip28_strip.png"]  # the kept strip
    out = json.loads((one / "eval_output.json").read_text())
    assert out["computed"] == {"clip28": 2, "chain241": 1, "live240": 3}
    assert out["kept"] == ["sft/chain241", "sft/clip28"]
    # the table names the rows whose digits came from other numerics, and which
    lines = (one / "table.md").read_text().split("\n\n")[0].splitlines()
    assert lines[0] == "rows computed under other numerics:" and len(lines) == 3, lines
    other = next(line for line in lines if "Another CPU" in line)
    assert other.endswith(": sft/clip28, sft/chain241"), other
    here = next(line for line in lines[1:] if "Another CPU" not in line)
    assert "stage1_tf/clip28" in here and "stage1_tf/live240" in here and "sft/" not in here


def test_a_kept_row_is_keyed_by_the_export_the_sweep_and_the_code(world, tmp_path):
    """Another export file (its SHA256), another setting of the sweep, another snapshot or other
    code: evaluated again; a setting of another sweep: kept."""
    _, cfg, spec = world
    sha = spec.exports[0].sha256 or ""
    code, ctx = code_version(), context_doc(cfg)
    cases: list[Case] = []

    def key(s: EvalInput = spec, sweep: str = "clip28", export: str = sha, version: str = code) -> str:
        return row_key(version, export, clip_sweep_doc(sweep, s, cases), ctx)

    assert key() == key()
    assert key(export="0" * 64) != key()
    assert key(spec.model_copy(update={"eval": spec.eval.model_copy(update={"seed": 1})})) != key()
    fewer = spec.model_copy(update={"eval": spec.eval.model_copy(update={"clip28_cells": 20})})
    assert key(fewer) != key() and key(fewer, "chain241") == key(sweep="chain241")
    assert key(spec.model_copy(update={"manifest_version": 2})) != key()
    edited = tmp_path / "core"
    shutil.copytree(Path(__file__).resolve().parents[2] / "gc25d_core" / "eval", edited / "eval")
    assert code_version(edited, ("eval",)) == code_version(sources=("eval",))
    (edited / "eval" / "metrics.py").write_text((edited / "eval" / "metrics.py").read_text() + "\n# edited\n")
    assert code_version(edited, ("eval",)) != code_version(sources=("eval",))
    store = ResultStore(tmp_path / "rows")
    record = {"cpu_vendor": "GenuineIntel", "cpu": "Xeon", "threads": 1}
    row = {"sampler": {"kind": "causal"}, "sweep": {"x": float("nan")}, "strip": b"png", "numerics": record}
    store.put(key(), row)
    got = store.get(key())
    assert got is not None and got["strip"] == b"png" and math.isnan(got["sweep"]["x"])
    assert got["numerics"] == record  # kept beside the row, not in its key
    store.put(key(), {k: v for k, v in row.items() if k != "numerics"})
    assert store.get(key())["numerics"] is None  # a row from before rows recorded it
    assert store.get(key(export="0" * 64)) is None
