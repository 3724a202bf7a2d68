"""Stage 1 (teacher forcing) in one process on the tiny world: per-cell timesteps and the clean
anchor, the loss over cells 1.. weighted per cell, a run from a teacher's hand-off that validates
its starting point and writes a causal export, and teacher forcing = the KV rollout on the trained
checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from gc25d_core.flow import DEPLOY_AXIS, WAN_SCHEDULE
from gc25d_core.report import StdoutReporter
from gc25d_core.train.causal_run import noise_per_cell
from gc25d_core.train.loop import run_stage
from tests.models.tiny import kv_cell_output, make_inputs
from tests.train.world import stage1_world

STEPS = 4
STAGE1 = {
    "engine": "torch",
    "max_steps": STEPS,
    "export_every": STEPS,
    "state_every": 2,
    "val": {"every": 2, "num_clips": 2},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stage1")
    cfg = stage1_world(root, STAGE1)
    summary = run_stage(cfg, "stage1_tf", root / "run", StdoutReporter(rank=0))
    return cfg, root / "run", summary


def test_noise_per_cell_keeps_the_anchor_clean_and_noises_each_cell_at_its_own_t():
    x0, noise = torch.randn(2, 3, 4, 2, 2), torch.randn(2, 3, 4, 2, 2)
    t = torch.tensor([[0.0, 999.8, 500.0, 100.0], [0.0, 250.0, 250.0, 4.98]])
    x_t = noise_per_cell(WAN_SCHEDULE, x0, t, noise)
    assert torch.equal(x_t[:, :, 0], x0[:, :, 0])
    for b in range(2):
        for j in range(1, 4):
            s = float(WAN_SCHEDULE.sigma(t[b, j]))
            torch.testing.assert_close(x_t[b, :, j], (1 - s) * x0[b, :, j] + s * noise[b, :, j])


def test_runs_from_the_handoff_and_validates_the_starting_point(trained):
    _, run, summary = trained
    assert summary["final_step"] == STEPS
    val = [json.loads(line) for line in (run / "val.jsonl").read_text().splitlines()]
    assert [r["step"] for r in val] == [0, 2, 4]  # step 0: the teacher under the causal mask
    assert all("causal_x0_mse_t500" in r and "copy_prev_x0_mse" in r and "cond_mse_t500" in r for r in val)
    assert len({r["copy_prev_x0_mse"] for r in val}) == 1  # the data-only baseline does not move
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] > 0 and 0 < r["t_mean"] < 1000 for r in train)
    assert train[-1]["lr"] == train[-1]["cond_lr"] == pytest.approx(1e-4)  # one lr for every parameter
    cfg = (run / "config.yaml").read_text()
    assert "init: handoff" in cfg and "teacher.json" in cfg


def test_the_export_is_causal_with_the_deploy_attention_and_its_provenance(trained):
    from gc25d_core.models.export import read_export

    cfg, run, _ = trained
    _, meta = read_export(run / "exports" / f"step-{STEPS:06d}.safetensors")
    assert meta.causal is not None and (meta.causal.sink, meta.causal.window, meta.causal.rope_cap) == (
        3,
        17,
        20,
    )
    assert meta.denoise_axis == DEPLOY_AXIS.timesteps
    assert meta.extra["teacher_forcing"] == "true"
    assert (meta.extra["windowed_train"], meta.extra["windowed_sink"]) == ("0", "0")
    init = json.loads(meta.extra["init_ckpt"])
    teacher = json.loads((cfg.stage1_tf.model.handoff).read_text())
    assert (init["path"], init["sha256"]) == (teacher["export"], teacher["sha256"])
    final = json.loads((run / "final.json").read_text())
    assert final["stage"] == "stage1_tf" and final["step"] == STEPS


def test_teacher_forcing_equals_the_kv_rollout_on_the_trained_checkpoint(trained):
    """Noisy cell i under teacher forcing = a KV rollout that committed the clean cells 0..i-1 at
    t = 0 and then ran noisy cell i (fp32, 1e-5), with the weights stage 1 trained."""
    from gc25d_core.models.configs import FULL_CAUSAL
    from gc25d_core.models.loading import load_gc_weights

    _, run, _ = trained
    model, _ = load_gc_weights(run / "exports" / f"step-{STEPS:06d}.safetensors", dtype=torch.float32)
    model.eval()
    n = 6
    clean, context, ids = make_inputs(n, seed=3)
    noisy = torch.randn_like(clean)
    noisy[:, :, 0] = clean[:, :, 0]
    t = torch.tensor([[0.0, 950.0, 800.0, 600.0, 350.0, 120.0]])
    with torch.no_grad():
        tf = model.forward_teacher_forcing(clean, noisy, t, context, ids, causal=FULL_CAUSAL)
        for i in range(1, n):
            out = kv_cell_output(model, clean, noisy, t, context, ids, FULL_CAUSAL, i)
            torch.testing.assert_close(out, tf[:, :, i : i + 1], rtol=1e-5, atol=1e-5)
