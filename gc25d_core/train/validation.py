"""Validation on fixed val clips of the pinned snapshot: velocity MSE at fixed t in three modes.

cond (the clip's ids and prompts), uncond (ids all UNKNOWN) and null text (the NULL prompt on every
cell); unweighted MSE over cells 1..; the clips are split over ranks and the sums all-reduced. The
noise of each (clip, t) comes from a generator seeded by (seed, clip, t), the same at every
validation, so curves compare across steps and stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gc25d_core.distributed import all_reduce, global_rank, world_size
from gc25d_core.flow import FlowSchedule
from gc25d_core.stage_config import ValConfig
from gc25d_core.train.data import generator
from gc25d_core.train.inputs import cell_mse, ti2v_inputs
from gc25d_core.vocab import UNKNOWN, Vocab, check_ids

VAL_MODES = ("cond", "uncond", "null_text")

# (x_t, t, per-cell text keys [B][cells], ids [B, F, h, w], the clean x0 a causal model's teacher
# forcing conditions on) -> the model's velocity prediction
Predict = Callable[[torch.Tensor, float, list[list[str]], torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ValClip:
    sample_id: str
    latent: torch.Tensor  # bf16 [48, 21, H, W]
    ids: torch.Tensor  # uint8 [81, h, w]
    keys: list[str]


def load_val_clips(
    store: Any, ref: Any, val: ValConfig, prompt_to_key: dict[str, str], vocab: Vocab
) -> list[ValClip]:
    """The first ``num_clips`` val samples of the pinned snapshot in the consumer's canonical order
    (the same on every rank and every launch)."""
    from gc25d_core.cache.consumer import ConsumerConfig, StreamingCache

    ds = StreamingCache(
        store,
        ConsumerConfig(split="val", seed=val.seed, batch_size=1),
        manifest=ref,
        rank=0,
        world_size=1,
        collate_fn=None,
    )
    clips: list[ValClip] = []
    if ds.num_eligible() == 0:
        return clips
    for batch in ds.iter_batches():
        for s in batch.samples:
            keys = [prompt_to_key[p] for p in s.meta["prompts"]]
            check_ids(s.tensors["cond_ids"].numpy(), vocab, f"val {s.key.sample_id}: cond_ids")
            clips.append(ValClip(s.key.sample_id, s.tensors["latent"], s.tensors["cond_ids"], keys))
            if len(clips) == val.num_clips:
                return clips
    return clips


def lockstep_clips(clips: list[ValClip]) -> list[tuple[ValClip, float]]:
    """This rank's share of ``clips`` with weight 1, padded so that every rank gets the same count
    (a sharded model gathers its weights in each forward): a rank past the end repeats a clip with
    weight 0, whose numbers it drops."""
    rank, n_ranks = global_rank(), world_size()
    out = []
    for k in range(-(-len(clips) // n_ranks)):
        i = rank + k * n_ranks
        out.append((clips[i % len(clips)], float(i < len(clips))))
    return out


@torch.no_grad()
def validate_modes(
    clips: list[ValClip],
    val: ValConfig,
    schedule: FlowSchedule,
    predict: Predict,
    device: torch.device,
    sem_rms: Callable[[], float] | None = None,
) -> dict[str, float]:
    """``{mode}_mse_t{t}``, ``{mode}_mse`` (mean over t) and ``cond_sem_rms`` over every rank's clips."""
    from gc25d_core.text import NULL_KEY

    ts = [float(schedule.timestep_at(schedule.index_of(t))) for t in val.timesteps]
    sums = np.zeros(len(VAL_MODES) * len(ts) + 1)
    for clip, weight in lockstep_clips(clips):
        for j, (t_req, t) in enumerate(zip(val.timesteps, ts, strict=True)):
            gen = generator(val.seed, "val", clip.sample_id, t_req)
            x0, x_t, target = ti2v_inputs(schedule, clip.latent[None], t, gen, device)
            for m, mode in enumerate(VAL_MODES):
                ids = torch.full_like(clip.ids, UNKNOWN) if mode == "uncond" else clip.ids
                keys = [NULL_KEY] * len(clip.keys) if mode == "null_text" else clip.keys
                sums[m * len(ts) + j] += weight * float(
                    cell_mse(predict(x_t, t, [keys], ids[None], x0), target)
                )
                if mode == "cond" and sem_rms is not None:
                    sums[-1] += weight * sem_rms()
    tot = all_reduce(sums.tolist(), device)
    n = len(clips)
    out: dict[str, float] = {"num_clips": float(n)}
    for i, mode in enumerate(VAL_MODES):
        per_t = [tot[i * len(ts) + j] / n for j in range(len(ts))]
        for t_req, v in zip(val.timesteps, per_t, strict=True):
            out[f"{mode}_mse_t{int(round(t_req))}"] = v
        out[f"{mode}_mse"] = sum(per_t) / len(per_t)
    out["cond_sem_rms"] = tot[-1] / (n * len(ts))
    return out
