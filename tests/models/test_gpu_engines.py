"""The FSDP engine on CUDA at world size 1 through accelerate's FSDP plugin (the CPU tests go through
torch's FSDP over gloo, because accelerate enables FSDP only for accelerator devices): the real SFT
entry point under torchrun on the tiny world, bf16, 4 steps, then a second launch that resumes from
the step-4 state to step 6, beside an uninterrupted 6-step run. Imports nothing from Dagster (the GPU
image lacks it); run with ``pytest -m gpu tests/models/test_gpu_engines.py`` (python -m bench.suites accel1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

RESUME_AT, STEPS = 4, 6
# the tiny preset's section, on CUDA through the FSDP engine in bf16; CUDA's deterministic mode is not
# what this test is about (atomics in bf16 reductions), so the curves are compared to a tolerance
SFT = {
    "engine": "fsdp",
    "precision": "bf16",
    "deterministic": False,
    "max_steps": STEPS,
    "state_every": 10**6,  # states only at the end of each launch (state_final)
    "export_every": 10**6,
    "val": {"every": 10**6, "num_clips": 2},
}


def _launch(config: Path, run_dir: Path, max_steps: int | None = None):
    from tests.train.resume_checks import launch

    argv = ["-m", "gc25d_core.jobs.sft", "--config", str(config), "--run-dir", str(run_dir)]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    out = launch(argv, nproc=1, timeout=300)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tests.train.world import sft_world, write_config

    root = tmp_path_factory.mktemp("gpu_fsdp")
    cfg = sft_world(root, SFT, overrides={"device": "cuda"})
    config = write_config(cfg, root / "run.yaml")
    first = _launch(config, root / "resumed", max_steps=RESUME_AT)
    first_curve = _records(root / "resumed" / "metrics.jsonl")
    second = _launch(config, root / "resumed")
    _launch(config, root / "full")
    return {"root": root, "first": first, "first_curve": first_curve, "second": second}


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_cuda_fsdp_through_accelerate_trains_in_bf16(fsdp_runs):
    run = fsdp_runs["root"] / "resumed"
    curve = fsdp_runs["first_curve"]
    assert [r["step"] for r in curve] == list(range(1, RESUME_AT + 1))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 and r["grad_norm"] > 0 for r in curve)
    assert all(r["peak_mem_gib"] > 0 for r in curve)  # logged on CUDA only
    assert "fsdp bf16 on 1 x cuda" in fsdp_runs["first"].stdout
    acc = (run / "accelerate.yaml").read_text()  # the FSDP plugin's settings, for a relaunch by hand
    assert "FSDP" in acc and "bf16" in acc
    meta = json.loads((run / "state" / f"step-{RESUME_AT:06d}" / "trainer.json").read_text())
    assert (meta["step"], meta["engine"], meta["world_size"]) == (RESUME_AT, "fsdp", 1)


def test_cuda_fsdp_resumes_and_the_curve_continues(fsdp_runs):
    root = fsdp_runs["root"]
    out = fsdp_runs["second"].stdout
    assert "resumed from" in out and f"(step {RESUME_AT})" in out
    done = json.loads((root / "resumed" / "done.json").read_text())
    assert (done["resumed_from_step"], done["final_step"], done["world_size"]) == (RESUME_AT, STEPS, 1)
    assert done["numerics"]["accelerator"] == torch.cuda.get_device_name()  # the card the digits came from
    resumed, full = _records(root / "resumed" / "metrics.jsonl"), _records(root / "full" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in full] == list(range(1, STEPS + 1))
    assert resumed[:RESUME_AT] == fsdp_runs["first_curve"]  # the first launch's records kept as they were
    # the steps after the resume see the same weights, optimizer state, schedule and data as an
    # uninterrupted run: same lr exactly, loss and gradient norm to bf16 noise
    for a, b in zip(resumed[RESUME_AT:], full[RESUME_AT:], strict=True):
        assert a["lr"] == b["lr"] and a["cond_lr"] == b["cond_lr"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-2)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=5e-2)
    assert all(r["loss"] > 0 and math.isfinite(r["loss"]) for r in resumed)


def test_cuda_fsdp_exports_the_whole_model_gathered_to_rank_0(fsdp_runs):
    """The export at the last step holds every weight under the unwrapped model's names (gathered
    through torch's full state dict, offloaded to the host), loads with the GcDiT loader, and the
    resumed run's export is the uninterrupted run's to bf16 noise."""
    from gc25d_core.models.export import read_export
    from gc25d_core.models.loading import load_gc_weights

    root = fsdp_runs["root"]
    name = f"exports/step-{STEPS:06d}.safetensors"
    resumed, _ = read_export(root / "resumed" / name)
    full, _ = read_export(root / "full" / name)
    model, _ = load_gc_weights(root / "resumed" / name)
    assert set(resumed) == set(full) == set(model.state_dict())
    assert not any("_fsdp_wrapped_module" in k for k in resumed)
    # the zero-init layer trained
    assert float(resumed["gc_sem_cond.proj_out.weight"].float().abs().sum()) > 0
    for k, v in resumed.items():
        assert v.device.type == "cpu" and torch.allclose(v.float(), full[k].float(), rtol=5e-2, atol=5e-3), k
