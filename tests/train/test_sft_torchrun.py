"""The real SFT entry point under torchrun (2 gloo ranks, DeepSpeed ZeRO-2 on CPU, tiny GcDiT):
trains, keeps exactly 2 state slots, writes loadable step-N exports, and a run killed mid-way
(GC25D_FAULT mode=exit) resumes to bit-identical weights, loss curve and validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.world import sft_world, write_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STEPS = 12
SFT = {"max_steps": STEPS, "state_every": 4, "save_every": 6, "val": {"every": 6, "num_clips": 2}}
CURVE_KEYS = (
    "loss",
    "mse",
    "t_mean",
    "grad_norm",
    "lr",
    "cond_lr",
    "sem_rms",
    "x_rms",
    "epoch",
    "frac_text_dropped",
    "frac_cond_dropped",
    "frac_masked",
)


def _launch(config: Path, run_dir: Path, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env.pop("GC25D_FAULT", None)
    if fault:
        env["GC25D_FAULT"] = fault
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "gc25d_core.jobs.sft",
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(a: Any, b: Any, where: str = "") -> None:
    """Recursive exact equality (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):  # e.g. DeepSpeed's loss scaler
        assert type(a) is type(b), where
        _same(vars(a), vars(b), where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _state_file(slot: Path, name: str) -> Any:
    """A state file as the trainer reads it: SHA256 checked against the slot's record, weights only."""
    from gc25d_core.checkpoint import load_torch, read_digests, recorded_digest
    from gc25d_core.train.safe_load import DEEPSPEED_STATE_CLASSES

    sha256 = recorded_digest(read_digests(slot), slot, name)
    return load_torch(slot / name, sha256, map_location="cpu", allowed=DEEPSPEED_STATE_CLASSES)


def _export(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {"metadata": f.metadata(), "tensors": {k: f.get_tensor(k) for k in f.keys()}}  # noqa: SIM118


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    cfg = sft_world(root, SFT)
    config = write_config(cfg, root / "run.yaml")
    full = _launch(config, root / "full")
    assert full.returncode == 0, full.stderr[-4000:]
    killed = _launch(config, root / "resumed", fault="rank=1,step=10,mode=exit")
    assert killed.returncode != 0
    after_kill = {
        "states": sorted(p.name for p in (root / "resumed" / "state").iterdir()),
        "steps": [r["step"] for r in _records(root / "resumed" / "metrics.jsonl")],
    }
    resumed = _launch(config, root / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return {
        "root": root,
        "full": root / "full",
        "resumed": root / "resumed",
        "after_kill": after_kill,
        "resumed_out": resumed.stdout,
    }


def test_trains_and_keeps_exactly_two_state_slots(runs):
    full = runs["full"]
    curve = _records(full / "metrics.jsonl")
    assert [r["step"] for r in curve] == list(range(1, STEPS + 1))
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 for r in curve)
    assert curve[0]["lr"] < curve[-1]["lr"] == pytest.approx(1e-4)  # warmup then constant
    assert curve[-1]["cond_lr"] == pytest.approx(1e-3)
    assert sorted(p.name for p in (full / "state").iterdir()) == ["step-000008", "step-000012"]
    slot = full / "state" / "step-000012"
    assert {"data.json", "trainer.json", "rng-rank0.pt", "rng-rank1.pt", "deepspeed", "sha256.json"} <= {
        p.name for p in slot.iterdir()
    }
    # every .pt either rank wrote (the model states, both ZeRO-2 optimizer shards, both RNG files)
    digests = json.loads((slot / "sha256.json").read_text())
    assert sorted(digests) == sorted(p.relative_to(slot).as_posix() for p in slot.rglob("*.pt"))
    assert len(digests) == 5
    assert json.loads((slot / "trainer.json").read_text())["step"] == STEPS
    assert json.loads((full / "deepspeed.json").read_text())["zero_optimization"]["stage"] == 2
    val = _records(full / "val.jsonl")
    assert [r["step"] for r in val] == [6, 12]
    assert all(r["num_clips"] == 2 and "cond_mse_t500" in r and "null_text_mse" in r for r in val)
    done = json.loads((full / "done.json").read_text())
    assert done["final_step"] == STEPS and done["exports"] == [
        "step-000006.safetensors",
        "step-000012.safetensors",
    ]


def test_killed_run_resumes_bit_identically(runs):
    full, resumed = runs["full"], runs["resumed"]
    # the kill hit rank 1 before step 10: states 4 and 8 existed, steps 1..9 had been logged
    assert runs["after_kill"]["states"] == ["step-000004", "step-000008"]
    assert runs["after_kill"]["steps"] == list(range(1, 10))
    assert "resumed from" in runs["resumed_out"] and "step 8" in runs["resumed_out"]
    a, b = _records(full / "metrics.jsonl"), _records(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))  # the redone step 9 logged once
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in CURVE_KEYS} == {k: rb[k] for k in CURVE_KEYS}, ra["step"]
    drop = ("step_s", "samples_per_s", "eta_s")
    va = [{k: v for k, v in r.items() if k not in drop} for r in _records(full / "val.jsonl")]
    vb = [{k: v for k, v in r.items() if k not in drop} for r in _records(resumed / "val.jsonl")]
    assert va == vb
    assert sorted(p.name for p in (resumed / "state").iterdir()) == ["step-000008", "step-000012"]
    for name in (
        "mp_rank_00_model_states.pt",
        *(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)),
    ):
        fa = _state_file(full / "state/step-000012", f"deepspeed/{name}")
        fb = _state_file(resumed / "state/step-000012", f"deepspeed/{name}")
        if "module" in fa:
            _same(fa["module"], fb["module"], name)
        else:
            _same(fa["optimizer_state_dict"], fb["optimizer_state_dict"], name)
    for name in ("step-000006.safetensors", "step-000012.safetensors"):
        # content, not bytes: safetensors writes the metadata map in a per-process hash order
        _same(_export(full / "exports" / name), _export(resumed / "exports" / name), name)
    assert json.loads((full / "state/step-000012/data.json").read_text()) == json.loads(
        (resumed / "state/step-000012/data.json").read_text()
    )


def test_exports_load_with_the_gcdit_loaders(runs):
    from gc25d_core.models.export import read_export
    from gc25d_core.models.loading import load_gc_weights

    path = runs["full"] / "exports" / "step-000012.safetensors"
    sd, meta = read_export(path)
    assert meta.vocab == "parts" and meta.causal is None and meta.data == "codeworld"
    assert meta.extra["stage"] == "sft" and meta.extra["step"] == "12"
    assert json.loads(meta.extra["flow"]) == {"template": "Wan", "shift": 5.0, "num_steps": 1000}
    model, _ = load_gc_weights(path)
    assert model.gc_config.dim == 96 and model.gc_config.num_layers == 2
    state = _state_file(runs["full"] / "state/step-000012", "deepspeed/mp_rank_00_model_states.pt")["module"]
    for k, v in sd.items():
        assert torch.equal(v, state[k].to(torch.bfloat16)), k
    assert float(sd["gc_sem_cond.proj_out.weight"].float().abs().sum()) > 0  # the zero-init layer trained


def test_pick_over_the_run_folder(runs):
    from gc25d_core.train.pick import pick_sft_run

    p = pick_sft_run(runs["full"], min_step=0)
    assert p.step in (6, 12) and p.path is not None and p.path.is_file()
