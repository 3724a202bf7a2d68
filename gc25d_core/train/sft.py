"""SPEC §7 SFT: the bidirectional teacher (GcDiT), flow matching 'Wan' shift 5.

One optimizer step = ``grad_accum`` micro-batches of ``micro_batch`` clips on every rank. Per
micro-batch: one grid index i ~ U{0..999}, t = t_i; x_t from the TI2V inputs (cell 0 clean); loss =
MSE(v̂, ε − x0) over cells 1..20 × w(t). Noise and t come from generators seeded by (seed, rank,
step, micro), so a resumed run draws exactly what an uninterrupted one does.

The rest is shared (train.denoiser over train.loop, .engine, .state, .data, .validation).

Bit-identical resume (deterministic mode) needs the consumer to re-deal the remaining shards the way
the uninterrupted run had them: equal-size shards consumed in lockstep, ``num_workers`` ≤ 1, the same
world size; on CPU also a fixed single intra-op thread (torchrun's default OMP_NUM_THREADS=1).
Otherwise resume is still exactly-once (no sample lost or repeated) but the order after the restart
may differ. The snapshot stays pinned for the whole run (new snapshots go to new runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.stage_config import SftConfig
from gc25d_core.train.data import TrainingSample, batch_of
from gc25d_core.train.denoiser import DenoiserRun, MicroLoss
from gc25d_core.train.inputs import cell_mse, ti2v_inputs
from gc25d_core.train.metrics import JsonlLog
from gc25d_core.train.presets import stage_config, with_stage

__all__ = ["SftConfig", "SftRun", "sft_config", "with_sft"]


def sft_config(cfg: Gc25dConfig) -> SftConfig:
    return stage_config(cfg, "sft")


def with_sft(cfg: Gc25dConfig, section: str | dict[str, Any], overrides: dict[str, Any] | None = None):
    """``cfg`` with ``sft`` = configs/sft/<section>.yaml (or a dict), deep-merged with overrides."""
    return with_stage(cfg, "sft", section, overrides)


class SftRun(DenoiserRun):
    name = "sft"
    section: SftConfig

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        idx = int(self.schedule.sample_index(gen)[0])
        t, w = float(self.schedule.timesteps[idx]), float(self.schedule.weights[idx])
        latent, ids = batch_of([s.latent for s in samples]), batch_of([s.ids for s in samples])
        _, x_t, target = ti2v_inputs(self.schedule, latent, t, gen, self.device)
        pred = self.model(**self.kwargs(x_t, t, [s.keys for s in samples], ids), **self.checkpointing())
        mse = cell_mse(pred, target)
        return MicroLoss(mse * w, mse, t)


def iter_val_records(run_dir: Path | str) -> Iterator[dict[str, Any]]:
    yield from JsonlLog(Path(run_dir) / "val.jsonl", False).records()
