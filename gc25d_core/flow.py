"""Flow matching, 'Wan' template (research/diffsynth_wan22.md §4, distill_anchors.md §1), and the one
definition of the 4-step denoise axis (DESIGN.md §4.3).

Notation: σ is the noise level, t = 1000·σ, x0 clean latents, ε ~ N(0, I), v = ε − x0.

Training grid (``FlowSchedule``, N = 1000, shift s = 5): raw σ_i = linspace(1, 0, N+1)[:-1], shifted
σ_i ← s·σ_i / (1 + (s−1)·σ_i), t_i = 1000·σ_i. So t runs 1000, 999.8, …, 4.98 and σ at indices
0/250/500/750/999 is 1.0 / 0.9375 / 0.8333 / 0.625 / 0.00498.

Training weight: y_i = exp(−2·((t_i − 500)/1000)²), w_i = (y_i − min y)·N / Σ_j (y_j − min y) (mean 1
over the grid; 0 at t = 1000, max ≈ 2.08 near t = 500). For N ≠ 1000 the template adds the
``w·N/1000 + w[1]`` correction, kept here for completeness.

Lookups (σ and w of an arbitrary t) take the nearest grid point, ``argmin |t_grid − t|``.

Forward process ``add_noise``: x_t = (1 − σ)·x0 + σ·ε; target ``velocity_target`` = ε − x0;
``x0_from_velocity``: x0 = x_t − σ·v; ``euler_step``: x_{σ'} = x_σ + (σ' − σ)·v. The first two also
at a σ given directly (``noise_at_sigma``, ``x0_at_sigma``: per cell, or a few-step axis's nominal
σ = t / 1000, ``axis_sigma``): every noising and x0 in training, eval and deploy is one of these.

The grid is computed in float64 and cast on use; tables are the same on every rank and device.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

WAN_SHIFT = 5.0
NUM_TRAIN_TIMESTEPS = 1000
NOMINAL_DEPLOY_AXIS: tuple[float, ...] = (1000.0, 750.0, 500.0, 250.0)


def shift_sigma(sigma: torch.Tensor | float, shift: float = WAN_SHIFT) -> torch.Tensor:
    """σ' = s·σ / (1 + (s − 1)·σ)."""
    s = torch.as_tensor(sigma, dtype=torch.float64)
    return shift * s / (1.0 + (shift - 1.0) * s)


def noise_at_sigma(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """x_σ = (1 − σ)·x0 + σ·ε; ``sigma`` a float or a tensor that broadcasts against x0 (one per
    clip, one per cell), in the caller's precision (a float stays a float: no rounding to x0's dtype
    before 1 − σ)."""
    return (1.0 - sigma) * x0 + sigma * noise


def x0_at_sigma(x_t: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """x0 = x_σ − σ·v, the clean estimate of a velocity prediction (``sigma`` as in ``noise_at_sigma``)."""
    return x_t - sigma * v


def axis_sigma(t: float) -> float:
    """σ = t / 1000 of a few-step axis timestep (``DenoiseAxis.timesteps``), not a grid lookup: the
    rollout's denoise and re-noise steps use the axis's own σ."""
    return float(t) / NUM_TRAIN_TIMESTEPS


@dataclass(frozen=True)
class FlowSchedule:
    """The shifted training grid: ``sigmas`` / ``timesteps`` / ``weights`` float64 [N] (t decreasing)."""

    shift: float = WAN_SHIFT
    num_steps: int = NUM_TRAIN_TIMESTEPS
    sigma_min: float = 0.0
    sigma_max: float = 1.0

    def __post_init__(self) -> None:
        if self.num_steps < 2:
            raise ValueError(f"num_steps={self.num_steps} must be >= 2")
        if self.shift <= 0:
            raise ValueError(f"shift={self.shift} must be > 0")

    @cached_property
    def sigmas(self) -> torch.Tensor:
        raw = torch.linspace(self.sigma_max, self.sigma_min, self.num_steps + 1, dtype=torch.float64)[:-1]
        return shift_sigma(raw, self.shift)

    @cached_property
    def timesteps(self) -> torch.Tensor:
        return self.sigmas * NUM_TRAIN_TIMESTEPS

    @cached_property
    def weights(self) -> torch.Tensor:
        t = self.timesteps
        y = torch.exp(-2.0 * ((t - NUM_TRAIN_TIMESTEPS / 2) / NUM_TRAIN_TIMESTEPS) ** 2)
        y_shift = y - y.min()
        w = y_shift * (self.num_steps / y_shift.sum())
        if self.num_steps != NUM_TRAIN_TIMESTEPS:
            w = w * (self.num_steps / NUM_TRAIN_TIMESTEPS) + w[1]
        return w

    # -- lookups --------------------------------------------------------------------------------

    def index_of(self, t: torch.Tensor | float) -> torch.Tensor:
        """Nearest grid index of each t (int64, t's shape)."""
        tt = torch.as_tensor(t, dtype=torch.float64).to("cpu")
        return (self.timesteps[None, :] - tt.reshape(-1, 1)).abs().argmin(dim=1).reshape(tt.shape)

    def sigma(self, t: torch.Tensor | float) -> torch.Tensor:
        """σ of the nearest grid point (float64, t's shape, CPU)."""
        return self.sigmas[self.index_of(t)]

    def training_weight(self, t: torch.Tensor | float) -> torch.Tensor:
        """w of the nearest grid point (float64, t's shape, CPU)."""
        return self.weights[self.index_of(t)]

    def timestep_at(self, index: torch.Tensor | int) -> torch.Tensor:
        return self.timesteps[torch.as_tensor(index, dtype=torch.long)]

    def sample_index(self, generator: torch.Generator, size: int = 1) -> torch.Tensor:
        """Uniform grid indices ``[size]`` (CPU generator): one t per micro-batch uses ``size=1``."""
        return torch.randint(0, self.num_steps, (size,), generator=generator)

    # -- forward process ------------------------------------------------------------------------

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        """x_t = (1 − σ(t))·x0 + σ(t)·ε; ``t`` scalar or [B] (broadcast over the other dims)."""
        return noise_at_sigma(x0, noise, _broadcast(self.sigma(t), x0))

    @staticmethod
    def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """v* = ε − x0."""
        return noise - x0

    def x0_from_velocity(self, x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        """x0 = x_t − σ(t)·v (``t`` as in ``add_noise``)."""
        return x0_at_sigma(x_t, v, _broadcast(self.sigma(t), x_t))

    def euler_step(
        self, x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor | float, t_next: torch.Tensor | float
    ) -> torch.Tensor:
        """x_{t'} = x_t + (σ(t') − σ(t))·v; ``t_next = 0`` means σ = 0 (the clean end)."""
        s = self.sigma(t)
        tn = torch.as_tensor(t_next, dtype=torch.float64)
        s_next = torch.where(tn <= 0, torch.zeros_like(tn), self.sigma(tn))
        return x_t + _broadcast(s_next - s, x_t) * v

    def describe(self) -> dict[str, float | int | str]:
        return {"template": "Wan", "shift": self.shift, "num_steps": self.num_steps}


def _broadcast(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """float64 scalar / [B] -> like's dtype and device, shaped [B, 1, ...] for broadcasting."""
    v = values.to(device=like.device, dtype=like.dtype)
    if v.ndim == 0:
        return v
    return v.reshape(v.shape[0], *([1] * (like.ndim - 1)))


WAN_SCHEDULE = FlowSchedule()
"""The SPEC's schedule: 'Wan', shift 5, 1000 training steps."""


# --- the 4-step denoise axis (DESIGN.md §4.3) --------------------------------------------------


@dataclass(frozen=True)
class DenoiseAxis:
    """The few-step axis of CD targets, DMD rollouts and deploy, defined once.

    ``nominal``: the SPEC's 1000/750/500/250. ``warp=True`` maps each nominal value through the
    1000-step shifted training table, t_k = table[N − nominal_k] (the Self-Forcing / Causal-Forcing
    ``warp_denoising_step`` convention), giving 1000 / 937.5 / 833.3 / 625; ``warp=False`` uses the
    nominal values as t (σ = 1, .75, .5, .25). The resolved ``timesteps`` are what checkpoints and
    exports record (``to_metadata``); consumers read them from there and never re-derive the axis.
    The denoise chain ends at t = 0 (the commit), which is not part of the axis.
    """

    nominal: tuple[float, ...] = NOMINAL_DEPLOY_AXIS
    warp: bool = True
    schedule: FlowSchedule = field(default_factory=FlowSchedule)

    def __post_init__(self) -> None:
        if not self.nominal:
            raise ValueError("a denoise axis needs at least one step")
        if any(b >= a for a, b in zip(self.nominal, self.nominal[1:], strict=False)):
            raise ValueError(f"nominal axis {self.nominal} must be strictly decreasing")
        if self.nominal[0] > NUM_TRAIN_TIMESTEPS or self.nominal[-1] <= 0:
            raise ValueError(f"nominal axis {self.nominal} must lie in (0, {NUM_TRAIN_TIMESTEPS}]")
        if self.warp:
            for v in self.nominal:
                idx = self.schedule.num_steps - v * self.schedule.num_steps / NUM_TRAIN_TIMESTEPS
                if abs(idx - round(idx)) > 1e-9:
                    raise ValueError(f"nominal {v} does not land on the {self.schedule.num_steps}-step grid")

    @property
    def timesteps(self) -> tuple[float, ...]:
        if not self.warp:
            return tuple(float(v) for v in self.nominal)
        n = self.schedule.num_steps
        table = self.schedule.timesteps
        return tuple(float(table[round(n - v * n / NUM_TRAIN_TIMESTEPS)]) for v in self.nominal)

    @property
    def sigmas(self) -> tuple[float, ...]:
        return tuple(axis_sigma(t) for t in self.timesteps)

    @property
    def num_steps(self) -> int:
        return len(self.nominal)

    def to_metadata(self) -> dict[str, str]:
        """String metadata (checkpoints, exports): the resolved axis plus how it was made."""
        return {
            "denoise_axis": json.dumps(list(self.timesteps)),
            "denoise_axis_nominal": json.dumps(list(self.nominal)),
            "denoise_axis_warp": "true" if self.warp else "false",
            "flow_shift": repr(self.schedule.shift),
        }

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> DenoiseAxis:
        axis = cls(
            nominal=tuple(float(v) for v in json.loads(meta["denoise_axis_nominal"])),
            warp=meta["denoise_axis_warp"] == "true",
            schedule=FlowSchedule(shift=float(meta.get("flow_shift", WAN_SHIFT))),
        )
        recorded = tuple(float(v) for v in json.loads(meta["denoise_axis"]))
        if not all(
            math.isclose(a, b, rel_tol=0, abs_tol=1e-9) for a, b in zip(axis.timesteps, recorded, strict=True)
        ):
            raise ValueError(f"recorded denoise_axis {recorded} differs from its definition {axis.timesteps}")
        return axis


DEPLOY_AXIS = DenoiseAxis()
"""Nominal 1000/750/500/250 with the shift warp: t = 1000 / 937.5 / 833.3 / 625 (DESIGN.md §4.3).
Chosen to match the Self-Forcing / Causal-Forcing anchors, whose 4-step lists are warped through the
training table; change it only with a recorded reason (it must be identical in CD, DMD and deploy)."""
