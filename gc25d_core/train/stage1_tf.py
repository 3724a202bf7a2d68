"""SPEC §8 stage 1: the causal student by teacher forcing, initialised from the picked SFT teacher.

Per micro-batch every noisy cell j ≥ 1 of every clip draws its own grid index i_j ~ U{0..999}
(t_j = t_{i_j}; the anchors' convention, docs/decisions.md); cell 0 is the clean TI2V anchor
(t = 0). Teacher forcing over [clean | noisy] (train.causal_run): noisy cell j sees the clean cells
before it and itself. Loss = mean over cells 1..20 (and clips) of MSE(v̂_j, ε_j − x0_j) × w(t_j).
The data, dropouts and UNKNOWN masking are SFT's; with ``val.at_start`` the initial weights (the
SFT teacher under the causal mask, before any fine-tuning) give the step-0 baseline.
"""

from __future__ import annotations

import torch

from gc25d_core.stage_config import Stage1Config
from gc25d_core.train.causal_run import CausalRun, noise_per_cell
from gc25d_core.train.data import TrainingSample
from gc25d_core.train.denoiser import MicroLoss
from gc25d_core.train.inputs import draw_noise

__all__ = ["Stage1Run"]


class Stage1Run(CausalRun):
    name = "stage1_tf"
    section: Stage1Config
    init_causal = False  # the SFT teacher: a causal export here would skip what this stage teaches

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        x0, ids, keys = self.clean_batch(samples)
        b, n = x0.shape[0], x0.shape[2]
        idx = self.schedule.sample_index(gen, b * n).view(b, n)
        t_cells = self.schedule.timesteps[idx].float()
        t_cells[:, 0] = 0.0
        weights = self.schedule.weights[idx].float().to(self.device)
        noise = draw_noise(x0.shape, gen, self.device)
        x_t = noise_per_cell(self.schedule, x0, t_cells, noise)
        kwargs = self.tf_kwargs(x_t, t_cells, keys, ids, x0)
        pred = self.model(**kwargs, **self.checkpointing())
        per_cell = (pred.float() - (noise - x0)).pow(2).mean(dim=(1, 3, 4))[:, 1:]  # [B, N-1]
        loss = (per_cell * weights[:, 1:]).mean()
        return MicroLoss(loss, per_cell.mean(), float(t_cells[:, 1:].mean()))
