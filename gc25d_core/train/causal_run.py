"""What the causal stages share (stage 1 teacher forcing, stage 2 consistency distillation).

``CausalRun`` is a ``DenoiserRun`` whose model is the causal student: its forwards are teacher
forcing over [clean | noisy] with the same RoPE positions (the clean copy at t = 0), full causal in
training ("windowed 0/0") unless the section names a window; its validation modes run that way too
(the noisy cells see the clean past), plus the next-cell x0 error at ``causal_val_t`` beside the
error of copying the previous clean cell; its exports are causal, with the deploy attention
(sink / window / RoPE cap), the deploy denoise axis and teacher_forcing / windowed_* / init_ckpt.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from gc25d_core.distributed import all_reduce
from gc25d_core.flow import DEPLOY_AXIS, FlowSchedule, noise_at_sigma, x0_at_sigma
from gc25d_core.models.configs import FULL_CAUSAL, CausalConfig
from gc25d_core.stage_config import CausalStageConfig
from gc25d_core.train.data import generator
from gc25d_core.train.denoiser import DenoiserRun
from gc25d_core.train.inputs import draw_noise, to_device
from gc25d_core.train.validation import lockstep_clips

__all__ = ["CausalRun", "noise_per_cell", "train_causal"]


def train_causal(sec: CausalStageConfig) -> CausalConfig:
    """The training attention: full causal for window 0, else the given sink / window (no RoPE cap)."""
    if sec.train_window == 0:
        return FULL_CAUSAL
    return CausalConfig(sink=sec.train_sink, window=sec.train_window, rope_cap=None)


def noise_per_cell(
    schedule: FlowSchedule, x0: torch.Tensor, t_cells: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """x_t with cell j at σ(t_j) (t_cells [B, N]); cell 0 is kept clean exactly."""
    x_t = noise_at_sigma(x0, noise, schedule.sigma(t_cells).to(x0)[:, None, :, None, None])
    x_t[:, :, 0] = x0[:, :, 0]
    return x_t


def cells_at(t: float, batch: int, num_cells: int) -> torch.Tensor:
    """[B, N] timesteps: every noisy cell at ``t``, the anchor cell 0 at 0."""
    t_cells = torch.full((batch, num_cells), float(t))
    t_cells[:, 0] = 0.0
    return t_cells


class CausalRun(DenoiserRun):
    section: CausalStageConfig

    def tf_kwargs(
        self, x_t: torch.Tensor, t_cells: Any, keys: list[list[str]], ids: torch.Tensor, x0: torch.Tensor
    ) -> dict[str, Any]:
        """Teacher-forcing arguments: the noisy ``x_t`` at ``t_cells`` given the clean ``x0``."""
        kw = self.kwargs(x_t, t_cells, keys, ids)
        return {**kw, "mode": "tf", "clean": x0.to(kw["latents"].dtype), "causal": train_causal(self.section)}

    def predict(
        self, x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor, x0: torch.Tensor
    ) -> torch.Tensor:
        return self.model.infer(**self.tf_kwargs(x_t, cells_at(t, x_t.shape[0], x_t.shape[2]), keys, ids, x0))

    def extra_validation(self, step: int) -> dict[str, float]:
        """Next-cell x0 MSE at causal_val_t given the clean past, and the copy-the-previous-cell one,
        over cells 1..; the clips split over the ranks in lockstep (as the modes are)."""
        sec = self.section
        t = float(self.schedule.timestep_at(self.schedule.index_of(sec.causal_val_t)))
        sums = np.zeros(2)
        clips = self.val_clips
        for clip, weight in lockstep_clips(clips):
            x0 = to_device(clip.latent[None], self.device).float()
            gen = generator(sec.val.seed, "causal_val", clip.sample_id, sec.causal_val_t)
            noise = draw_noise(x0.shape, gen, self.device)
            t_cells = cells_at(t, 1, x0.shape[2])
            x_t = noise_per_cell(self.schedule, x0, t_cells, noise)
            v = self.model.infer(**self.tf_kwargs(x_t, t_cells, [clip.keys], clip.ids[None], x0)).float()
            x0_hat = x0_at_sigma(x_t, v, float(self.schedule.sigma(t)))
            sums[0] += weight * float((x0_hat - x0)[:, :, 1:].pow(2).mean())
            sums[1] += weight * float((x0[:, :, :-1] - x0[:, :, 1:]).pow(2).mean())
        tot = all_reduce(sums.tolist(), self.device)
        tag = int(round(sec.causal_val_t))
        return {f"causal_x0_mse_t{tag}": tot[0] / len(clips), "copy_prev_x0_mse": tot[1] / len(clips)}

    def export_metadata(self, step: int) -> dict[str, Any]:
        sec, meta = self.section, super().export_metadata(step)
        meta["extra"].update(
            teacher_forcing="true",
            windowed_train=str(sec.train_window),
            windowed_sink=str(sec.train_sink),
            denoise_axis_def=json.dumps(DEPLOY_AXIS.to_metadata(), sort_keys=True),
        )
        deploy = sec.deploy
        meta["causal"] = CausalConfig(sink=deploy.sink, window=deploy.window, rope_cap=deploy.rope_cap)
        meta["denoise_axis"] = DEPLOY_AXIS.timesteps
        return meta
