"""The real stage entry points under torchrun (2 gloo ranks, tiny GcDiT), for each stage and engine:
trains, keeps exactly 2 state slots with every tensor file recorded by SHA256, writes loadable step-N
exports, and a run killed mid-way (GC25D_FAULT mode=exit) resumes to bit-identical weights,
optimizer state, loss curve and validation. Nothing here reads an engine's own file names; a new
stage joins by adding a line to RUNS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.train.resume_checks import assert_same_tensors, launch, records
from tests.train.world import sft_world, stage1_world, stage2_world, stage3_world, write_config

pytestmark = pytest.mark.slow

STEPS = 8
SECTION = {"max_steps": STEPS, "state_every": 3, "export_every": 4, "val": {"every": 4, "num_clips": 2}}
# (stage, engine): zero2 = accelerate + DeepSpeed ZeRO-2 (the presets' engine), torch = DDP, fsdp = FULL_SHARD
RUNS = (
    ("sft", "zero2"),
    ("sft", "torch"),
    ("sft", "fsdp"),
    ("stage1_tf", "zero2"),
    ("stage2_cd", "zero2"),
    ("stage3_dmd", "fsdp"),
)
WORLDS = {"sft": sft_world, "stage1_tf": stage1_world, "stage2_cd": stage2_world, "stage3_dmd": stage3_world}
# the EMAs start at step 3, so the kill at step 7 (resume from 6) is past their start
EXTRA = {
    # the SFT run pins what its checks assume (the preset's model and rates are tuned for make run)
    "sft": {
        "optim": {"lr": 1e-4, "cond_lr": 1e-3, "warmup_steps": 5},
        "model": {"overrides": {"dim": 96, "ffn_dim": 256, "num_layers": 2}},
    },
    "stage2_cd": {"ema": {"start_step": 3}},
    # stage 3: one critic step per generator step and shorter rollouts keep the test short
    "stage3_dmd": {
        "ema": {"start_step": 3},
        "critic_steps": 1,
        "max_cells": 23,
        "optim": {"warmup_steps": 5},
    },
}
# the distillation stages have one lr for every parameter
COND_LR = {"sft": 1e-3, "stage1_tf": 1e-4, "stage2_cd": 1e-4, "stage3_dmd": 1e-4}
# the causal stages 1 and 2 also validate their starting point (val.at_start)
VAL_STEPS = {"sft": [4, 8], "stage1_tf": [0, 4, 8], "stage2_cd": [0, 4, 8], "stage3_dmd": [4, 8]}


def _launch(stage: str, config: Path, run_dir: Path, fault: str | None = None):
    argv = ["-m", "gc25d_core.jobs.train", "--stage", stage, "--config", str(config)]
    argv += ["--run-dir", str(run_dir)]
    return launch(argv, nproc=2, fault=fault)


@pytest.fixture(scope="module", params=RUNS, ids=[f"{s}-{e}" for s, e in RUNS])
def runs(request, tmp_path_factory):
    stage, engine = request.param
    root = tmp_path_factory.mktemp(f"{stage}_{engine}")
    cfg = WORLDS[stage](root, {**SECTION, "engine": engine, **EXTRA.get(stage, {})})
    config = write_config(cfg, root / "run.yaml")

    full = _launch(stage, config, root / "full")
    assert full.returncode == 0, full.stderr[-4000:]
    killed = _launch(stage, config, root / "resumed", fault="rank=1,step=7,mode=exit")
    assert killed.returncode != 0
    after_kill = {
        "states": sorted(p.name for p in (root / "resumed" / "state").iterdir()),
        "steps": [r["step"] for r in records(root / "resumed" / "metrics.jsonl")],
    }
    resumed = _launch(stage, config, root / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return {
        "stage": stage,
        "engine": engine,
        "full": root / "full",
        "resumed": root / "resumed",
        "after_kill": after_kill,
        "resumed_out": resumed.stdout,
        "full_err": full.stderr,
    }


def test_trains_and_keeps_exactly_two_state_slots(runs):
    full = runs["full"]
    curve = records(full / "metrics.jsonl")
    assert [r["step"] for r in curve] == list(range(1, STEPS + 1))
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 for r in curve)
    if runs["stage"] == "stage3_dmd":  # the stage's loss is its generator's
        assert all(r["loss"] == r["gen_loss"] and r["critic_loss"] > 0 for r in curve)
    if runs["stage"] == "stage3_dmd":  # the rollout's cell count and exit step: the same on every rank
        assert all(r["rollout_cells_min"] == r["rollout_cells_max"] for r in curve)
        assert all(r["exit_step_min"] == r["exit_step_max"] for r in curve)
        assert len({r["rollout_cells_min"] for r in curve}) > 1  # and drawn anew per step
    assert curve[0]["lr"] < curve[-1]["lr"] == pytest.approx(1e-4)  # warmup then constant
    assert curve[-1]["cond_lr"] == pytest.approx(COND_LR[runs["stage"]])
    assert sorted(p.name for p in (full / "state").iterdir()) == ["step-000006", "step-000008"]
    slot = full / "state" / "step-000008"
    assert {"data.json", "trainer.json", "rng-rank0.pt", "rng-rank1.pt", "sha256.json"} <= {
        p.name for p in slot.iterdir()
    }
    # every tensor file either rank wrote is recorded, and only those
    digests = json.loads((slot / "sha256.json").read_text())
    assert sorted(digests) == sorted(p.relative_to(slot).as_posix() for p in slot.rglob("*.pt"))
    meta = json.loads((slot / "trainer.json").read_text())
    assert (meta["step"], meta["engine"], meta["world_size"]) == (STEPS, runs["engine"], 2)
    resolved = full / "config.yaml"  # the one resolved config of the run folder
    assert resolved.is_file() and not (full / "sft_resolved.yaml").exists()
    if runs["engine"] == "zero2":  # the generated configs a user relaunches with by hand
        assert json.loads((full / "deepspeed.json").read_text())["zero_optimization"]["stage"] == 2
        assert "DEEPSPEED" in (full / "accelerate.yaml").read_text()
    val = records(full / "val.jsonl")
    assert [r["step"] for r in val] == VAL_STEPS[runs["stage"]]
    assert all(r["num_clips"] == 2 and "cond_mse_t500" in r and "null_text_mse" in r for r in val)
    done = json.loads((full / "done.json").read_text())
    assert done["final_step"] == STEPS and done["exports"] == [
        "step-000004.safetensors",
        "step-000008.safetensors",
    ]
    handoff = json.loads((full / "final.json").read_text())
    assert handoff["stage"] == runs["stage"] and handoff["step"] == STEPS
    # named relative to the runs root (the world's root, the run folder's parent)
    assert handoff["export"] == "full/exports/step-000008.safetensors"


def test_killed_run_resumes_bit_identically(runs):
    full, resumed = runs["full"], runs["resumed"]
    # the kill hit rank 1 before step 7: states 3 and 6 existed, steps 1..6 had been logged
    assert runs["after_kill"]["states"] == ["step-000003", "step-000006"]
    assert runs["after_kill"]["steps"] == list(range(1, 7))
    assert "resumed from" in runs["resumed_out"] and "step 6" in runs["resumed_out"]
    # the progress line's rate counts this session's 2 steps, not the 6 it resumed with
    assert f"steps {STEPS}/{STEPS} (resumed at 6, " in runs["resumed_out"]
    a, b = records(full / "metrics.jsonl"), records(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))  # the redone step 7 logged once
    assert a == b
    assert records(full / "val.jsonl") == records(resumed / "val.jsonl")
    assert sorted(p.name for p in (resumed / "state").iterdir()) == ["step-000006", "step-000008"]
    slot = "state/step-000008"
    assert assert_same_tensors(full / slot, resumed / slot, "*.pt") > 0  # weights, optimizer, RNG
    # content, not bytes: safetensors writes the metadata map in a per-process hash order
    assert assert_same_tensors(full / "exports", resumed / "exports", "*.safetensors") > 0
    assert json.loads((full / slot / "data.json").read_text()) == json.loads(
        (resumed / slot / "data.json").read_text()
    )


def test_the_ranks_print_no_warning(runs):
    """No deprecation or other warning from the job's own calls, nor from a library's call into
    torch that the job filters by name (DeepSpeed's all-gather), in the ranks' output."""
    warned = [line for line in runs["full_err"].splitlines() if "Warning" in line]
    assert not warned, "\n".join(warned[:10])


def test_tensorboard_has_train_loss_for_every_stage(runs):
    """What the README promises a user of TensorBoard: train/loss at every step of every stage,
    as TensorBoard's own reader sees the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(runs["full"] / "tensorboard"))
    acc.Reload()
    assert "train/loss" in acc.Tags()["scalars"]
    losses = {e.step: e.value for e in acc.Scalars("train/loss")}
    curve = records(runs["full"] / "metrics.jsonl")
    assert sorted(losses) == [r["step"] for r in curve]
    assert all(losses[r["step"]] == pytest.approx(r["loss"], rel=1e-6) for r in curve)


def test_exports_load_with_the_gcdit_loaders(runs):
    from gc25d_core.models.export import read_export
    from gc25d_core.models.loading import load_gc_weights

    path = runs["full"] / "exports" / "step-000008.safetensors"
    sd, meta = read_export(path)
    assert meta.vocab == "parts" and meta.data == "codeworld"
    assert (meta.causal is not None) == (runs["stage"] != "sft")
    assert meta.extra["stage"] == runs["stage"] and meta.extra["step"] == "8"
    assert json.loads(meta.extra["flow"]) == {"template": "Wan", "shift": 5.0, "num_steps": 1000}
    model, _ = load_gc_weights(path)
    assert model.gc_config.dim == 96 and model.gc_config.num_layers == 2
    assert float(sd["gc_sem_cond.proj_out.weight"].float().abs().sum()) > 0  # the zero-init layer trained
    assert all(v.dtype == torch.bfloat16 for v in sd.values())


def test_pick_over_the_run_folder(runs):
    from gc25d_core.train.pick import pick_sft_run

    p = pick_sft_run(runs["full"], min_step=1)
    assert p.step in (4, 8) and p.path is not None and p.path.is_file()
