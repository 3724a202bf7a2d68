"""SPEC §8 stage 3: DMD with self-rollout, a critic and FSDP.

Networks: the generator G (causal, the stage-2 EMA final export, trained), the real score (the SFT
teacher, bidirectional, frozen: never gets gradients) and the critic / fake score (bidirectional,
initialised from the SFT teacher, trained). One optimizer step = ``critic_steps`` critic updates,
each on a fresh batch and a fresh no-grad rollout, then one generator update: two optimizer
phases (train.denoiser.Phase), whose micro-step bookkeeping (batches, seeded draws, backward,
optimizer steps, sums) is the shared step's; with ``batch_critic_rollouts`` the critic updates'
rollouts run first, as one batch (the generator does not change between them). This file holds the
losses and the scoring; the rollout is train.self_rollout's.

Self-rollout (the deploy runtime's code: models.sampler.CausalStreamer, the 4-step consistency
sampler with the commit at t = 0; deploy forces the exit step to the last under no_grad):
1 + N cells, N + 1 drawn in min_cells..max_cells and one exit step e on rank 0 and broadcast, so
every rank makes the same forwards (FSDP gathers in each). Cell 0 is the real clean anchor z0;
cells 1..N denoise with the deploy attention (sink / window / RoPE cap) and the real per-cell ids
and prompts from cond + extension (has_ext clips only). Steps before e run under no_grad; the exit
forward holds the graph only for the last ``grad_horizon`` K cells; the commit runs under no_grad,
so no gradient crosses cells through the cache.

Scored clip ("frankenstein tail"): cell 0 + the last K generated cells, with their ids and prompts;
cell 0 is clean, t = 0, and masked out of both losses. With one t per clip (clamped to
[t_min, t_max]) and x_t = (1 − σ)·x + σ·ε:
    grad = nan_to_num((x̂_fake − x̂_real) / mean|x − x̂_real|)   (per clip, over its unmasked cells)
    L_G  = ½·mean((x − sg(x − grad))²) in float64, so ∂L_G/∂x = grad / numel on the unmasked cells
    L_D  = mean((v̂_critic(x_t) − (ε − x))²) on a no-grad rollout (flow matching, no w(t))
cfg 1.0 (SPEC §8): one conditional pass of the real score. ``real_guidance`` g > 1 guides it over
the ids, x̂_real = x̂_uncond + g·(x̂_cond − x̂_uncond) with every id UNKNOWN in the uncond pass
(validation's uncond; both passes in one batch).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from gc25d_core.distributed import all_reduce
from gc25d_core.flow import noise_at_sigma, x0_at_sigma
from gc25d_core.models.configs import CausalConfig
from gc25d_core.models.fast_rollout import RolloutRunner
from gc25d_core.stage_config import Stage3Config
from gc25d_core.train.causal_run import CausalRun
from gc25d_core.train.data import TrainingSample
from gc25d_core.train.denoiser import Micro, Phase
from gc25d_core.train.ema import Ema
from gc25d_core.train.engine import Trained
from gc25d_core.train.inputs import draw_noise
from gc25d_core.train.model import build_model, init_export, param_groups
from gc25d_core.train.self_rollout import SelfRollout
from gc25d_core.train.state import ResumePoint, Stateful
from gc25d_core.vocab import UNKNOWN

__all__ = ["Stage3Run", "critic_flow_loss", "dmd_gradient", "dmd_generator_loss"]


# ============================================================================== the math


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    m = mask.to(x.dtype).expand_as(x)
    return (x * m).sum(dims) / m.sum(dims)


def dmd_gradient(
    x: torch.Tensor, x_fake: torch.Tensor, x_real: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The DMD gradient (x̂_fake − x̂_real) normalised per sample by mean |x − x̂_real| over the
    unmasked elements; NaN / inf become 0 (DMD eqs. 7–8, the anchors' nan_to_num)."""
    dims = tuple(range(1, x.ndim))
    norm = _masked_mean((x - x_real).abs(), mask, dims).reshape(-1, *([1] * (x.ndim - 1)))
    return torch.nan_to_num((x_fake - x_real) / norm) * mask.to(x.dtype)


def dmd_generator_loss(x: torch.Tensor, grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """½·mean over the unmasked elements of (x − sg(x − grad))², in float64: its autograd gradient
    is grad / numel there (the surrogate that carries the DMD gradient into the generator)."""
    target = (x - grad).detach().double()
    sq = (x.double() - target).pow(2)
    m = mask.expand_as(sq)
    return 0.5 * sq[m].mean()


def critic_flow_loss(
    v_hat: torch.Tensor, noise: torch.Tensor, x: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Flow matching on generated samples: mean over the unmasked elements of (v̂ − (ε − x))²."""
    sq = (v_hat.float() - (noise - x).float()).pow(2)
    return sq[mask.expand_as(sq)].mean()


# ============================================================================== the stage


class Stage3Run(SelfRollout, CausalRun):
    name = "stage3_dmd"
    section: Stage3Config
    init_causal = True  # the generator: stage 2's EMA export
    kv_forwards = True  # its rollouts

    def build(self, resume: ResumePoint) -> None:
        from gc25d_core.index import read_index
        from gc25d_core.layout import Layout
        from gc25d_core.models.export import read_export_meta

        sec = self.section
        root = Path(sec.data.meta_root or self.cfg.paths.data_root)
        without_ext = tuple(sorted(r.clip_id for r in read_index(Layout(root)) if not r.has_ext))
        self.open_stream(resume, exclude=without_ext)  # the rollout needs the extension's ids and prompts
        self.build_models_and_validation()
        path, _ = init_export(sec.model, self.cfg.paths.runs_root)
        meta = read_export_meta(path)  # its weights were checked causal when the generator was built
        assert meta.denoise_axis is not None  # a causal export records its axis (parse_metadata)
        self.axis = tuple(float(t) for t in meta.denoise_axis)
        self.rollout_causal = CausalConfig(
            sink=sec.deploy.sink, window=sec.deploy.window, rope_cap=sec.deploy.rope_cap
        )
        # the K exit forwards recompute their blocks in backward (model.gradient_checkpointing):
        # without it each holds its activations and the K/V of the cells it saw until the backward
        self.rollout_checkpoint = sec.model.gradient_checkpointing
        # the real score and the critic are bidirectional: the SFT teacher, not a causal export
        real = build_model(
            self.cfg, sec.real, self.device, self.engine.build_dtype, section="stage3_dmd.real", causal=False
        )
        critic = build_model(
            self.cfg, sec.real, self.device, self.engine.build_dtype, section="stage3_dmd.real", causal=False
        )
        co = sec.critic_optim
        self.critic: Trained = self.engine.train(
            "critic", critic, co, lambda m: param_groups(m, co.lr, co.cond_lr)
        )
        self.real = self.engine.frozen(real)
        self.ema: Ema = Ema(self.model, sec.ema)  # before any state is loaded: the loop restores it
        self.sync_phases = sec.time_phases
        self.draws = []
        self.critic_clips: dict[int, tuple[torch.Tensor, torch.Tensor, list[list[str]]]] = {}
        self.rollout_path = sec.rollout_path
        self.fast_runner: RolloutRunner | None = None  # built on the first fast rollout
        self.gather_s = 0.0  # the step's seconds gathering the replica's weights (fast path)
        self.graphs_warned = False

    def state_parts(self) -> dict[str, Stateful]:
        return {**super().state_parts(), "critic": self.critic}

    # -- the losses ---------------------------------------------------------------------------------

    def _noised(
        self, x: torch.Tensor, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """(x_t with the clean anchor, ε, the mask of scored cells, t): one t per clip, clamped."""
        sec = self.section
        t = float(self.schedule.timesteps[int(self.schedule.sample_index(gen)[0])])
        t = min(max(t, sec.t_min), sec.t_max)
        noise = draw_noise(x.shape, gen, self.device)
        x_t = noise_at_sigma(x, noise, float(self.schedule.sigma(t)))
        x_t[:, :, 0] = x[:, :, 0]  # the anchor: clean, t = 0 (TI2V), ε unused
        mask = torch.ones(1, 1, x.shape[2], 1, 1, dtype=torch.bool, device=self.device)
        mask[:, :, 0] = False
        return x_t, noise, mask, t

    def _score(
        self, net: Any, x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor
    ) -> torch.Tensor:
        """x̂0 of a bidirectional score network (TI2V: cell 0 at t = 0)."""
        v = net(**self.kwargs(x_t, t, keys, ids)).float()
        return x0_at_sigma(x_t, v, float(self.schedule.sigma(t)))

    def real_x0(self, x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor) -> torch.Tensor:
        """The real score's x̂0, guided over the ids by ``real_guidance`` (one pass at 1.0)."""
        g = self.section.real_guidance
        if g == 1.0:
            return self._score(self.real, x_t, t, keys, ids)
        both = self._score(
            self.real, torch.cat([x_t, x_t]), t, keys + keys, torch.cat([ids, torch.full_like(ids, UNKNOWN)])
        )
        cond, uncond = both.chunk(2)
        return uncond + g * (cond - uncond)

    # -- the optimizer phases -----------------------------------------------------------------------

    DEVICE_SUMS = ("critic_loss", "gen_loss", "grad_norm")
    HOST_SUMS = ("t",)

    def phases(self) -> list[Phase]:
        """``critic_steps`` critic updates, each on a fresh batch and a fresh no-grad rollout, then
        one generator update (the EMA follows it); only the generator's grad norm is recorded."""
        return [
            Phase(
                "critic",
                self.critic,
                self.critic_micro,
                updates=self.section.critic_steps,
                grad_norm=None,
                key=lambda update, micro: (update,),
                prefetch=self.roll_critic_clips if self.section.batch_critic_rollouts else None,
            ),
            Phase("generator", self.model, self.generator_micro, key=lambda update, micro: ()),
        ]

    def roll_critic_clips(
        self, step: int, batches: list[tuple[list[TrainingSample], torch.Generator]]
    ) -> None:
        """The critic updates' no-grad rollouts of a step as one batch (``batch_critic_rollouts``):
        the generator does not change between them, so they can all run before the first."""
        draws = [self._draw(step, k) for k in range(len(batches))]
        with torch.no_grad():
            clips = self.rollout_groups([b for b, _ in batches], draws, [g for _, g in batches], grad=False)
        self.critic_clips = dict(enumerate(clips))

    def critic_micro(self, samples: list[TrainingSample], gen: torch.Generator, step: int, k: int) -> Micro:
        """L_D on a no-grad rollout: the critic's flow loss on the generated clip."""
        if k in self.critic_clips:
            x, ids, keys = self.critic_clips.pop(k)
        else:
            with torch.no_grad():
                x, ids, keys = self.rollout(samples, *self._draw(step, k), gen, grad=False)
        x_t, noise, mask, t = self._noised(x, gen)
        v_hat = self.critic(**self.kwargs(x_t, t, keys, ids))
        loss = critic_flow_loss(v_hat, noise, x, mask)
        return Micro(loss, {"critic_loss": loss.detach() / self.section.critic_steps}, {})

    def generator_micro(
        self, samples: list[TrainingSample], gen: torch.Generator, step: int, update: int
    ) -> Micro:
        """L_G: the DMD surrogate on a rollout whose last K exit forwards hold the graph."""
        x, ids, keys = self.rollout(samples, *self._draw(step, self.section.critic_steps), gen, grad=True)
        x_t, _, mask, t = self._noised(x.detach(), gen)
        with torch.no_grad():
            x_fake = self._score(self.critic.infer, x_t, t, keys, ids)
            x_real = self.real_x0(x_t, t, keys, ids)
            grad = dmd_gradient(x.detach(), x_fake, x_real, mask)
        loss = dmd_generator_loss(x, grad, mask)
        return Micro(loss, {"gen_loss": loss.detach().float()}, {"t": t})

    def step_record(self, tot: dict[str, float], seconds: dict[str, float]) -> dict[str, float]:
        # the generator rollout's draws as the ranks saw them: min and max over ranks agree
        cells, exit_step = self.draws[-1]
        gather_s, self.gather_s = self.gather_s, 0.0
        off = self.fast_runner.graphs_disabled if self.fast_runner is not None else None
        if off and not self.graphs_warned:
            self.graphs_warned = True  # the rollouts still run, eagerly on the replica
            warnings.warn(f"stage 3 rollout: CUDA graphs off ({off})", stacklevel=1)
        lo = all_reduce([cells, exit_step], self.device, op="min")
        hi = all_reduce([-cells, -exit_step], self.device, op="min")
        lr, cond_lr = self.model.lrs()
        critic_lr = self.critic.lrs()[0]
        gen = tot["gen_loss"] / self.world_size
        return {
            # every stage logs ``loss`` (TensorBoard's train/loss): here the generator's DMD loss, the
            # objective the exported student minimises; the critic's flow loss stays beside it
            "loss": gen,
            "critic_loss": tot["critic_loss"] / self.world_size,
            "gen_loss": gen,
            "grad_norm": tot["grad_norm"],
            "t_mean": tot["t"] / self.world_size,
            "lr": lr,
            "cond_lr": cond_lr,
            "critic_lr": critic_lr,
            "critic_s": seconds["critic"],
            "generator_s": seconds["generator"],
            "rollout_gather_s": gather_s,
            "ema_started": float(self.ema.started),
            "rollout_cells_min": lo[0],
            "rollout_cells_max": -hi[0],
            "exit_step_min": lo[1],
            "exit_step_max": -hi[1],
            "epoch": self.data.epoch,
        }

    # -- export -------------------------------------------------------------------------------------

    def export_metadata(self, step: int) -> dict[str, Any]:
        sec, meta = self.section, super().export_metadata(step)
        meta["extra"].update(
            dmd=json.dumps(
                {
                    "critic_steps": sec.critic_steps,
                    "cells": [sec.min_cells, sec.max_cells],
                    "grad_horizon": sec.grad_horizon,
                    "cfg": sec.real_guidance,
                    "t_clamp": [sec.t_min, sec.t_max],
                }
            ),
        )
        return meta
