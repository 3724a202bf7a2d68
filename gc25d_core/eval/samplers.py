"""How each kind of export generates a rollout, so that every export answers the same cases.

* causal exports (stage 1, 2, 3, deploy): ``kv_rollout`` — the clean anchor prefilled at t = 0, each
  cell denoised along the export's recorded ``denoise_axis`` and committed at t = 0, with the
  export's recorded sink / window / RoPE cap. Nothing is re-derived.
* the bidirectional teacher (SFT): many Euler steps (default 40, index-evenly spaced on the shifted
  1000-step training grid, ending at σ = 0) over windows of at most ``window`` cells (default 21,
  the length it was trained on, so positions stay in its trained range). The first window is the
  TI2V clip: cell 0 the clean anchor at t = 0. Each further window starts with the last
  ``context_cells`` generated cells held clean at t = 0 (1: the TI2V anchor form it was trained
  with) and generates the rest; its ids start at the last frame of its first cell (a TI2V cell 0 is
  one frame). 28 cells = 21 + 7 new, 61 cells = 21 + 20 + 20.

Every sampler takes (anchor [B, 48, 1, H, W], ids uint8 [B, F, h, w], text keys [B][N], N, one
generator per row) and returns float32 latents [B, 48, N, H, W]. Each row draws its noise from its
own generator exactly as it would rolled out alone (the generators live on the model's device), so
a case's own and swapped rollouts run as one batch and differ from two single rollouts only by the
batched kernels' rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from gc25d_core.flow import FlowSchedule
from gc25d_core.models.configs import CausalConfig
from gc25d_core.text import TextBank


class Sampler(Protocol):
    def __call__(
        self,
        anchor: torch.Tensor,
        ids: torch.Tensor,
        keys: list[list[str]],
        num_cells: int,
        gens: Sequence[torch.Generator],
    ) -> torch.Tensor: ...

    def describe(self) -> dict[str, Any]: ...


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


class CausalSampler:
    def __init__(self, model: Any, text: TextBank, spec: CausalConfig, axis: Sequence[float]):
        self.model, self.text, self.spec = model, text, spec
        self.axis = tuple(float(t) for t in axis)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "causal",
            "sampler": "kv_rollout",
            "denoise_axis": list(self.axis),
            "causal": self.spec.model_dump(),
        }

    @torch.no_grad()
    def __call__(self, anchor, ids, keys, num_cells, gens):
        from gc25d_core.models.sampler import RowGroups, kv_rollout

        device = next(self.model.parameters()).device
        bank, index = self.text.context(keys)
        out = kv_rollout(
            self.model,
            anchor.to(device=device, dtype=_dtype(self.model)),
            num_cells,
            self.axis,
            spec=self.spec,
            context=bank,
            context_index=index,
            sem_ids=ids.to(device),
            groups=RowGroups(gens, [len(self.axis) - 1] * len(gens)),
        )
        return out.float()


def euler_points(schedule: FlowSchedule, steps: int) -> list[float]:
    """``steps + 1`` timesteps from t = 1000 to 0 (σ = 0), index-evenly spaced on the training grid."""
    idx = torch.linspace(0, schedule.num_steps, steps + 1).round().long().tolist()
    return [float(schedule.timestep_at(i)) if i < schedule.num_steps else 0.0 for i in idx]


class TeacherSampler:
    def __init__(
        self,
        model: Any,
        text: TextBank,
        schedule: FlowSchedule,
        *,
        steps: int = 40,
        window: int = 21,
        context_cells: int = 1,
        frames_per_cell: int = 4,
    ):
        if not 1 <= context_cells < window:
            raise ValueError(
                f"teacher context_cells={context_cells} must be in 1..window-1 (window={window})"
            )
        self.model, self.text, self.schedule = model, text, schedule
        self.steps, self.window, self.context_cells = steps, window, context_cells
        self.fpc = frames_per_cell
        self.points = euler_points(schedule, steps)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "teacher",
            "sampler": "euler",
            "steps": self.steps,
            "window": self.window,
            "context_cells": self.context_cells,
        }

    @torch.no_grad()
    def window_sample(
        self,
        context: torch.Tensor,
        ids: torch.Tensor,
        keys: list[list[str]],
        new: int,
        gens: Sequence[torch.Generator],
    ) -> torch.Tensor:
        """``new`` cells after the clean ``context`` [B, 48, k, H, W]: the window's new cells."""
        device, dtype = context.device, _dtype(self.model)
        k = context.shape[2]
        n = k + new
        shape = (1, context.shape[1], n, *context.shape[3:])
        x = torch.cat([torch.randn(shape, generator=g, device=device, dtype=torch.float32) for g in gens])
        x[:, :, :k] = context
        bank, index = self.text.context(keys)
        for t, t_next in zip(self.points, self.points[1:], strict=False):
            t_cells = torch.full((x.shape[0], n), t, device=device)
            t_cells[:, :k] = 0.0
            v = self.model(x.to(dtype), t_cells, bank, ids, context_index=index).float()
            x = self.schedule.euler_step(x, v, t, t_next)
            x[:, :, :k] = context  # held clean: only the new cells move
        return x[:, :, k:]

    def __call__(self, anchor, ids, keys, num_cells, gens):
        device = next(self.model.parameters()).device
        cells = [anchor.to(device).float()]
        ids = ids.to(device)
        done = 1
        while done < num_cells:
            k = min(self.context_cells, done)
            new = min(self.window - k, num_cells - done)
            a = done - k
            context = torch.cat(cells[a:done], dim=2)
            # the window's first cell is its TI2V cell 0: one frame, the last one of that cell
            f0 = 0 if a == 0 else self.fpc * a
            win_ids = ids[:, f0 : self.fpc * (a + k + new - 1) + 1]
            out = self.window_sample(context, win_ids, [r[a : a + k + new] for r in keys], new, gens)
            cells.extend(out.split(1, dim=2))
            done += new
        return torch.cat(cells, dim=2)
