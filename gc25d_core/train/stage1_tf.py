"""SPEC §8 stage 1: the causal student by teacher forcing, initialised from the picked SFT teacher.

Per micro-batch every noisy cell j ≥ 1 of every clip draws its own grid index i_j ~ U{0..999}
(t_j = t_{i_j}; the anchors' convention, docs/decisions.md); cell 0 is the clean TI2V anchor
(t = 0). The model runs teacher forcing over [clean | noisy] copies with the same RoPE positions,
the clean copy at t = 0, full causal in training ("windowed 0/0"): noisy cell j sees the clean
cells before it and itself. Loss = mean over cells 1..20 (and clips) of MSE(v̂_j, ε_j − x0_j) ×
w(t_j). The rest (data, dropouts and UNKNOWN masking as SFT's, engine, state, loop) is shared.

Validation adds a causal check to SFT's three modes: the next-cell x0 error at ``causal_val_t``
given the clean past (x̂0_j = x_t − σ·v̂_j from the teacher-forcing output), beside the error of
copying the previous clean cell. With ``val.at_start`` the initial weights (the SFT teacher under
the causal mask, before any fine-tuning) give the step-0 baseline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import all_reduce, global_rank, world_size
from gc25d_core.flow import DEPLOY_AXIS
from gc25d_core.models.configs import FULL_CAUSAL, CausalConfig
from gc25d_core.report import Reporter
from gc25d_core.train.config import Stage1Config
from gc25d_core.train.data import TrainingSample, batch_of, generator
from gc25d_core.train.denoiser import DenoiserRun, MicroLoss
from gc25d_core.train.inputs import draw_noise, to_device
from gc25d_core.train.presets import stage_config

__all__ = ["Stage1Run", "noise_per_cell", "run_stage1", "train_causal"]


def train_causal(sec: Stage1Config) -> CausalConfig:
    """The training attention: full causal for window 0, else the given sink / window (no RoPE cap)."""
    if sec.train_window == 0:
        return FULL_CAUSAL
    return CausalConfig(sink=sec.train_sink, window=sec.train_window, rope_cap=None)


def noise_per_cell(
    schedule: Any, x0: torch.Tensor, t_cells: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """x_t with cell j at σ(t_j) (t_cells [B, N]); cell 0 is kept clean exactly."""
    sigma = schedule.sigma(t_cells).to(x0)[:, None, :, None, None]
    x_t = (1.0 - sigma) * x0 + sigma * noise
    x_t[:, :, 0] = x0[:, :, 0]
    return x_t


class Stage1Run(DenoiserRun):
    name = "stage1_tf"
    section: Stage1Config

    def _tf_kwargs(self, x_t, t_cells, keys, ids, x0) -> dict[str, Any]:
        kw = self.kwargs(x_t, t_cells, keys, ids)
        return {**kw, "mode": "tf", "clean": x0.to(kw["latents"].dtype), "causal": train_causal(self.section)}

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        latent, ids = batch_of([s.latent for s in samples]), batch_of([s.ids for s in samples])
        x0 = to_device(latent, self.device).float()
        b, n = x0.shape[0], x0.shape[2]
        idx = self.schedule.sample_index(gen, b * n).view(b, n)
        t_cells = self.schedule.timesteps[idx].float()
        t_cells[:, 0] = 0.0
        weights = self.schedule.weights[idx].float().to(self.device)
        noise = draw_noise(x0.shape, gen, self.device)
        x_t = noise_per_cell(self.schedule, x0, t_cells, noise)
        pred = self.model(
            **self._tf_kwargs(x_t, t_cells, [s.keys for s in samples], ids, x0), **self.checkpointing()
        )
        per_cell = (pred.float() - (noise - x0)).pow(2).mean(dim=(1, 3, 4))[:, 1:]  # [B, N-1]
        loss = (per_cell * weights[:, 1:]).mean()
        return MicroLoss(loss, per_cell.mean(), float(t_cells[:, 1:].mean()))

    # -- validation -------------------------------------------------------------------------------

    def extra_validation(self, step: int) -> dict[str, float]:
        """Next-cell x0 MSE at causal_val_t given the clean past, and the copy-the-previous-cell one,
        over cells 1..; the clips split over the ranks in lockstep (as the modes are)."""
        sec, rank, world = self.section, global_rank(), world_size()
        t = float(self.schedule.timestep_at(self.schedule.index_of(sec.causal_val_t)))
        sums = np.zeros(2)
        clips = self.val_clips
        for k in range(-(-len(clips) // world)):
            i = rank + k * world
            clip, weight = clips[i % len(clips)], float(i < len(clips))
            x0 = to_device(clip.latent[None], self.device).float()
            gen = generator(sec.val.seed, "causal_val", clip.sample_id, sec.causal_val_t)
            noise = draw_noise(x0.shape, gen, self.device)
            t_cells = torch.full((1, x0.shape[2]), t)
            t_cells[:, 0] = 0.0
            x_t = noise_per_cell(self.schedule, x0, t_cells, noise)
            v = self.model.infer(**self._tf_kwargs(x_t, t_cells, [clip.keys], clip.ids[None], x0)).float()
            x0_hat = x_t - float(self.schedule.sigma(t)) * v
            sums[0] += weight * float((x0_hat - x0)[:, :, 1:].pow(2).mean())
            sums[1] += weight * float((x0[:, :, :-1] - x0[:, :, 1:]).pow(2).mean())
        tot = all_reduce(sums.tolist(), self.device)
        tag = int(round(sec.causal_val_t))
        return {f"causal_x0_mse_t{tag}": tot[0] / len(clips), "copy_prev_x0_mse": tot[1] / len(clips)}

    # -- export -----------------------------------------------------------------------------------

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


def run_stage1(
    cfg: Gc25dConfig,
    run_dir: Path | str,
    reporter: Reporter,
    *,
    max_steps: int | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """Train (or resume) stage 1 in ``run_dir``; every rank calls it inside a process group."""
    return Stage1Run(cfg, stage_config(cfg, "stage1_tf"), Path(run_dir), reporter, fresh=fresh).run(max_steps)
