"""Stage 2 (consistency distillation): the teacher's solve points, the target on a toy Gaussian
whose velocity and consistency map are analytic, a zero-length interval, which networks get
gradients, and a run with its EMA exports (tiny world, one process)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gc25d_core.flow import DEPLOY_AXIS, WAN_SCHEDULE
from gc25d_core.report import StdoutReporter
from gc25d_core.train.presets import stage_config
from gc25d_core.train.stage2_cd import Stage2Run, cd_target, interval_points
from tests.train.world import stage2_world

AXIS = DEPLOY_AXIS.timesteps  # 1000 / 937.5 / 833.3 / 625


def test_interval_points_follow_the_axis_and_the_fine_grid():
    for n in range(4):
        one = interval_points(AXIS, n, 1, WAN_SCHEDULE)
        assert one == [AXIS[n], AXIS[n + 1] if n < 3 else 0.0]  # the SPEC's single Euler step
        four = interval_points(AXIS, n, 4, WAN_SCHEDULE)
        assert len(four) == 5 and four[0] == one[0] and four[-1] == one[-1]
        assert all(a > b for a, b in zip(four, four[1:], strict=False))
        assert all(float(WAN_SCHEDULE.timestep_at(WAN_SCHEDULE.index_of(t))) == t for t in four[1:-1])


# ---------------------------------------------------------------------------- the toy Gaussian

S = 0.5  # data x0 ~ N(0, S²); x_σ = (1 − σ)·x0 + σ·ε


def _var(sigma: float) -> float:
    return (1 - sigma) ** 2 * S**2 + sigma**2


def _velocity(x: torch.Tensor, t: float) -> torch.Tensor:
    """E[ε − x0 | x_σ] = x·(σ − (1 − σ)S²) / var(σ), the exact teacher."""
    s = float(WAN_SCHEDULE.sigma(t))
    return x * (s - (1 - s) * S**2) / _var(s)


def _consistency(x: torch.Tensor, t: float) -> torch.Tensor:
    """The probability-flow map to σ = 0: f(x, σ) = x·S / √var(σ) (constant along the ODE)."""
    return x * S / math.sqrt(_var(float(WAN_SCHEDULE.sigma(t))))


def _residual(n: int, substeps: int) -> float:
    """E[(f_θ(x_{t_n}) − target)²] with the exact consistency map as student and target network:
    what the one-step solve's bias alone leaves, over x_{t_n} ~ N(0, var(σ_n))."""
    points = interval_points(AXIS, n, substeps, WAN_SCHEDULE)
    x = torch.linspace(-3, 3, 601, dtype=torch.float64) * math.sqrt(
        _var(float(WAN_SCHEDULE.sigma(points[0])))
    )
    target = cd_target(x, points, _velocity, _consistency, WAN_SCHEDULE)
    weight = torch.exp(-0.5 * (x / x.std()) ** 2)
    return float(((_consistency(x, points[0]) - target) ** 2 * weight).sum() / weight.sum())


def test_the_one_step_target_is_biased_on_the_4_point_axis_and_substeps_shrink_it():
    """With the exact velocity and consistency map the CD residual is the Euler solve's error alone.
    Measured (S = 0.5, data variance 0.25; per interval n = 0..3 of 1000/937.5/833.3/625/0):
      1 step:    1.5e-7, 2.4e-6, 1.7e-4, 2.5e-1
      4 steps:   1.0e-8, 1.7e-7, 1.4e-5, 3.0e-2
      16 steps:  6.4e-10, 1.1e-8, 8.7e-7, 2.2e-3
    The last interval (625 → 0) is the risk the anchors name: its one-step target is the teacher's
    x̂0 = E[x0 | x], the posterior mean, whose error against the ODE's endpoint is the size of the
    data variance; k sub-steps shrink every interval's residual by ~ k² (8–16× per 4× here)."""
    table = {k: [_residual(n, k) for n in range(4)] for k in (1, 4, 16)}
    assert all(r > 1e-8 for r in table[1])  # measurable on every interval
    assert table[1] == sorted(table[1])  # longer intervals (in σ) are worse
    assert table[1][3] > 0.5 * S**2  # the last one: as large as the data variance
    for n in range(4):
        assert table[4][n] < table[1][n] / 5 and table[16][n] < table[4][n] / 5


def test_a_zero_length_interval_gives_zero_loss():
    from tests.models.tiny import make_inputs, make_model

    model = make_model(seed=1)
    x_t, context, ids = make_inputs(4, seed=2)

    def x0(x: torch.Tensor, t: float) -> torch.Tensor:
        with torch.no_grad():
            return x - float(WAN_SCHEDULE.sigma(t)) * model(x, t, context, ids)

    def v_unused(x: torch.Tensor, t: float) -> torch.Tensor:
        raise AssertionError("a zero-length interval takes no teacher step")

    t = AXIS[1]
    target = cd_target(x_t, [t], v_unused, x0, WAN_SCHEDULE)  # the student is its own target network
    assert float((x0(x_t, t) - target).pow(2).mean()) == 0.0


# ---------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stage2")
    sec = {
        "engine": "torch",
        "max_steps": 4,
        "save_every": 4,
        "state_every": 2,
        "val": {"every": 2, "num_clips": 2},
    }
    cfg = stage2_world(root, {**sec, "ema": {"start_step": 2}})
    trainer = Stage2Run(cfg, stage_config(cfg, "stage2_cd"), root / "run", StdoutReporter(rank=0))
    return trainer, trainer.run()


def test_only_the_student_gets_gradients(run):
    trainer, summary = run
    assert summary["final_step"] == 4
    assert all(not p.requires_grad and p.grad is None for p in trainer.teacher.parameters())
    assert all(not s.requires_grad and s.grad is None for s in trainer.ema.shadow)
    assert any(p.grad is None for p in trainer.model.module.parameters())  # zeroed after the step
    assert trainer.ema.started and trainer.ema.updates == 3  # steps 2, 3, 4


def test_the_ema_and_student_exports_and_the_handoff(run):
    from gc25d_core.models.export import read_export

    trainer, _ = run
    student, smeta = read_export(trainer.export_dir / "step-000004.safetensors")
    ema, emeta = read_export(trainer.export_dir / "ema" / "step-000004.safetensors")
    assert emeta.extra["weights"] == "ema" and emeta.causal is not None and emeta.denoise_axis == AXIS
    assert json.loads(smeta.extra["cd_solver"]) == {"kind": "euler", "substeps": 1, "cfg": 1.0}
    assert any(not torch.equal(student[k], ema[k]) for k in student)
    final = json.loads((trainer.run_dir / "final.json").read_text())
    assert final["stage"] == "stage2_cd" and final["ema_export"].endswith("ema/step-000004.safetensors")


def test_stage2_refuses_a_teacher_that_is_not_causal(tmp_path):
    from tests.train.world import random_teacher, sft_world

    cfg = sft_world(tmp_path)
    from gc25d_core.train.presets import with_stage

    bidirectional = random_teacher(cfg, tmp_path)  # an SFT teacher.json, not stage 1's export
    cfg = with_stage(cfg, "stage2_cd", "tiny", {"engine": "torch", "model": {"handoff": str(bidirectional)}})
    with pytest.raises(ValueError, match="needs a causal export"):
        Stage2Run(cfg, stage_config(cfg, "stage2_cd"), tmp_path / "run", StdoutReporter(rank=0)).run()
