"""Golden losses of the distillation stages 1–3 on the tiny synthetic worlds, one rank, the plain
torch engine in this process (as tests/train/test_golden_sft.py does for the SFT). The reference
(tests/golden/stages_tiny.json) was recorded from the code before the loop gained optimizer phases
and the flow formulas moved into gc25d_core.flow; a refactor of the step mechanics must reproduce it.
Each stage's ``section`` there is its configs/<stage>/tiny.yaml as it was when recorded, so the
reference stays fixed when a preset is tuned.

Tolerance: the SFT golden's — relative 1e-6 on losses and validation, 1e-5 on the gradient norm;
the learning rates and the rollout draws exactly.

Its numbers hold for the CPU instruction set tests/conftest.py pins (AVX2).

Re-record (only for a change that is meant to move the numbers, with the reason in the commit):
``python -m tests.train.test_golden_stages record`` (from today's presets) or ``... rerecord`` (the
recorded sections kept: another pinned instruction set).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gc25d_core.report import StdoutReporter
from gc25d_core.train.loop import run_stage
from gc25d_core.train.presets import stage_section, with_stage
from tests.train.resume_checks import records
from tests.train.world import random_teacher, sft_world

GOLDEN_PATH = Path(__file__).parents[1] / "golden" / "stages_tiny.json"
STAGES = ("stage1_tf", "stage2_cd", "stage3_dmd")
# what the golden runs change from the preset: short, validating at steps 2 and 4, the EMAs past
# their start inside the run (stage 2's target network and stage 3's EMA both take their averaged path)
RUN: dict[str, Any] = {
    "engine": "torch",
    "max_steps": 4,
    "state_every": 4,
    "export_every": 4,
    "val": {"every": 2, "num_clips": 2},
}
EXTRA: dict[str, dict[str, Any]] = {
    "stage2_cd": {"ema": {"start_step": 2}},
    "stage3_dmd": {"ema": {"start_step": 2}},
}
# the text table shape the reference was recorded with
WORLD = {"text": {"max_len": 32}}
# per stage: the train-record keys compared with rel 1e-6, and those compared exactly
LOSSES = {
    "stage1_tf": ("loss", "mse", "t_mean"),
    "stage2_cd": ("loss", "mse", "t_mean"),
    "stage3_dmd": ("loss", "gen_loss", "critic_loss", "t_mean"),
}
EXACT = {
    "stage1_tf": ("lr",),
    "stage2_cd": ("lr",),
    "stage3_dmd": (
        "lr",
        "critic_lr",
        "ema_started",
        "rollout_cells_min",
        "rollout_cells_max",
        "exit_step_min",
        "exit_step_max",
    ),
}
VAL_SKIP = ("step", "num_clips")


def _config(root: Path, stage: str, section: dict[str, Any]):
    """The stage's tiny world (synthetic cache + random inits standing in for the upstream hand-offs)."""
    from gc25d_core.config import deep_merge

    cfg = sft_world(root, overrides=WORLD, ext=stage == "stage3_dmd")
    if stage == "stage1_tf":
        init = {"model": {"handoff": str(random_teacher(cfg, root))}}
    elif stage == "stage2_cd":
        init = {"model": {"handoff": str(random_teacher(cfg, root, causal=True))}}
    else:
        generator = random_teacher(cfg, root, seed=1, causal=True, stage="stage2_cd")
        init = {
            "model": {"handoff": str(generator)},
            "real": {"handoff": str(random_teacher(cfg, root, seed=2))},
        }
    return with_stage(cfg, stage, section, deep_merge(deep_merge(RUN, EXTRA.get(stage, {})), init))


def _train(root: Path, stage: str, section: dict[str, Any]) -> Path:
    run = root / "run"
    run_stage(_config(root, stage, section), stage, run, StdoutReporter(rank=0))
    return run


@pytest.mark.parametrize("stage", STAGES)
def test_the_stage_reproduces_its_golden_curve(tmp_path, one_thread, stage):
    golden = json.loads(GOLDEN_PATH.read_text())[stage]
    run = _train(tmp_path, stage, golden["section"])
    train, val = records(run / "metrics.jsonl"), records(run / "val.jsonl")
    assert [r["step"] for r in train] == [g["step"] for g in golden["train"]]
    for got, want in zip(train, golden["train"], strict=True):
        for key in LOSSES[stage]:
            assert got[key] == pytest.approx(want[key], rel=1e-6), (got["step"], key)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
        for key in EXACT[stage]:
            assert got[key] == want[key], (got["step"], key)
    assert [r["step"] for r in val] == [g["step"] for g in golden["val"]]
    for got, want in zip(val, golden["val"], strict=True):
        assert sorted(got) == sorted(want)
        for key in set(want) - set(VAL_SKIP):
            assert got[key] == pytest.approx(want[key], rel=1e-6), (got["step"], key)


def _record(keep_sections: bool = False) -> None:
    """Train every stage from its current tiny preset (or, ``keep_sections``, from the section the
    reference was recorded with) and write the reference file."""
    import subprocess
    import tempfile

    import torch

    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    out: dict[str, Any] = {
        "about": "stages 1-3 on the tiny synthetic worlds, 4 steps, 1 rank, torch engine, fp32, "
        f"deterministic, AVX2 (tests/train/test_golden_stages.py); recorded at {commit.strip()}; "
        "`section` is the configs/<stage>/tiny.yaml it was first recorded from (kept by `rerecord`)"
    }
    kept = json.loads(GOLDEN_PATH.read_text()) if keep_sections else {}
    for stage in STAGES:
        section = kept[stage]["section"] if keep_sections else stage_section(stage, "tiny")
        with tempfile.TemporaryDirectory() as tmp:
            run = _train(Path(tmp), stage, section)
            train, val = records(run / "metrics.jsonl"), records(run / "val.jsonl")
        keys = ("step", *LOSSES[stage], "grad_norm", *EXACT[stage])
        out[stage] = {
            "train": [{k: r[k] for k in keys} for r in train],
            "val": val,
            "section": section,
        }
    GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN_PATH.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__" and sys.argv[1:] in (["record"], ["rerecord"]):
    _record(keep_sections=sys.argv[1] == "rerecord")
