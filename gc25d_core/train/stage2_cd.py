"""SPEC §8 stage 2: causal consistency distillation onto the 4-step deploy axis, with an EMA target.

Teacher = student init = the stage-1 final export (a causal export: its denoise axis is read from
its metadata, never re-derived); the teacher is frozen. Per micro-batch one interval n of the axis
t_0 > t_1 > t_2 > t_3 (> t_4 = 0) is drawn; every noisy cell is at t_n (the anchors' convention,
cell 0 the clean anchor) and sees the clean past through teacher forcing:

    x_{t_n}     = (1 − σ_n)·x0 + σ_n·ε
    x_{t_{n+1}} = the teacher's Euler solve from t_n to t_{n+1}: one step (SPEC: solver 1, cfg 1.0,
                  one conditional pass), or ``teacher_substeps`` k steps on the fine shifted grid
    target      = x̂0_EMA(x_{t_{n+1}}) = x_{t_{n+1}} − σ_{n+1}·v_EMA, or x_{t_{n+1}} itself at t = 0
    loss        = mean over cells 1.. of (x̂0_θ(x_{t_n}) − sg(target))²

The EMA shadow (train.ema) copies the weights until ``ema.start_step`` and averages after, so before
it starts the target network is the online student under stop-gradient, as the SPEC asks. Only the
student gets gradients: the teacher is frozen and the target forward runs under no_grad. Exports:
the student's under exports/, the EMA's under exports/ema/ (the deploy candidate and stage 3's init).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gc25d_core.flow import FlowSchedule, x0_at_sigma
from gc25d_core.stage_config import Stage2Config
from gc25d_core.train.causal_run import CausalRun, cells_at, noise_per_cell
from gc25d_core.train.data import TrainingSample
from gc25d_core.train.denoiser import MicroLoss
from gc25d_core.train.ema import Ema
from gc25d_core.train.inputs import draw_noise
from gc25d_core.train.model import build_model, init_export
from gc25d_core.train.state import ResumePoint

__all__ = ["Stage2Run", "cd_target", "interval_points", "teacher_solve"]

Velocity = Callable[[torch.Tensor, float], torch.Tensor]  # (x_t, t) -> v
X0 = Callable[[torch.Tensor, float], torch.Tensor]  # (x_t, t) -> x̂0


def interval_points(axis: Sequence[float], n: int, substeps: int, schedule: FlowSchedule) -> list[float]:
    """The teacher's points from axis[n] to axis[n+1] (0 after the last): ``substeps`` Euler steps
    on the fine shifted grid (index-evenly spaced; σ = 0 is the end of the grid)."""
    ends = [*map(float, axis), 0.0]
    t_a, t_b = ends[n], ends[n + 1]
    i_a = int(schedule.index_of(t_a))
    i_b = schedule.num_steps if t_b <= 0 else int(schedule.index_of(t_b))
    inner = torch.linspace(i_a, i_b, substeps + 1).round().long().tolist()[1:-1]
    return [t_a, *(float(schedule.timestep_at(i)) for i in inner), t_b]


def teacher_solve(
    x: torch.Tensor, points: Sequence[float], velocity: Velocity, schedule: FlowSchedule
) -> torch.Tensor:
    """Euler steps x ← x + (σ(t') − σ(t))·v(x, t) along ``points``."""
    for t, t_next in zip(points, points[1:], strict=False):
        x = schedule.euler_step(x, velocity(x, t), t, t_next).to(x.dtype)
    return x


def cd_target(
    x_t: torch.Tensor, points: Sequence[float], teacher: Velocity, target_x0: X0, schedule: FlowSchedule
) -> torch.Tensor:
    """The consistency target of ``x_t`` at points[0]: the target network's x̂0 at the teacher's
    solve to points[-1], or that point itself when it is t = 0."""
    x_next = teacher_solve(x_t, points, teacher, schedule)
    return x_next if points[-1] <= 0 else target_x0(x_next, points[-1])


class Stage2Run(CausalRun):
    name = "stage2_cd"
    section: Stage2Config
    init_causal = True  # stage 1's final export: its denoise axis and attention are the targets

    def build(self, resume: ResumePoint) -> None:
        from gc25d_core.models.export import read_export_meta

        super().build(resume)  # builds the student from the hand-off: checked causal there
        sec = self.section
        path, _ = init_export(sec.model, self.cfg.paths.runs_root)
        meta = read_export_meta(path)
        assert meta.denoise_axis is not None  # a causal export records its axis (parse_metadata)
        self.axis = tuple(float(t) for t in meta.denoise_axis)
        self.teacher = self.engine.frozen(
            build_model(
                self.cfg,
                sec.model,
                self.device,
                self.engine.build_dtype,
                section="stage2_cd.model",
                causal=True,
            )
        )
        self.ema: Ema = Ema(self.model, sec.ema)  # before any state is loaded: the loop restores it

    def _velocity(self, module: Callable[..., torch.Tensor], x0, keys, ids) -> Velocity:
        """(x_t, t) -> v of ``module`` with every noisy cell at t, the clean past x0; cell 0 stays clean."""

        def v(x_t: torch.Tensor, t: float) -> torch.Tensor:
            out = module(
                **self.tf_kwargs(x_t, cells_at(t, x_t.shape[0], x_t.shape[2]), keys, ids, x0)
            ).float()
            out[:, :, 0] = 0.0  # the anchor does not move
            return out

        return v

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        sec = self.section
        x0, ids, keys = self.clean_batch(samples)
        n = int(torch.randint(0, len(self.axis), (1,), generator=gen))
        points = interval_points(self.axis, n, sec.teacher_substeps, self.schedule)
        noise = draw_noise(x0.shape, gen, self.device)
        x_t = noise_per_cell(self.schedule, x0, cells_at(points[0], x0.shape[0], x0.shape[2]), noise)
        with torch.no_grad():
            teacher = self._velocity(self.teacher, x0, keys, ids)
            target_v = self._velocity(self.model.infer, x0, keys, ids)

            def target_x0(x: torch.Tensor, t: float) -> torch.Tensor:
                # before the EMA starts its shadow is the weights: skip the no-op swap
                ema = self.ema
                swap = ema.swapped_in() if ema.started else contextlib.nullcontext()
                with swap:
                    return x0_at_sigma(x, target_v(x, t), float(self.schedule.sigma(t)))

            target = cd_target(x_t, points, teacher, target_x0, self.schedule)
        t_cells = cells_at(points[0], x0.shape[0], x0.shape[2])
        pred = self.model(**self.tf_kwargs(x_t, t_cells, keys, ids, x0), **self.checkpointing())
        x0_hat = x0_at_sigma(x_t, pred.float(), float(self.schedule.sigma(points[0])))
        mse = (x0_hat - target)[:, :, 1:].pow(2).mean()
        return MicroLoss(mse, mse, points[0])

    # -- export -----------------------------------------------------------------------------------

    def export_metadata(self, step: int) -> dict[str, Any]:
        meta = super().export_metadata(step)
        meta["extra"].update(
            cd_solver=json.dumps({"kind": "euler", "substeps": self.section.teacher_substeps, "cfg": 1.0}),
        )
        return meta
