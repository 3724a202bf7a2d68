"""SPEC §7 SFT: the bidirectional teacher (GcDiT), flow matching 'Wan' shift 5.

One optimizer step = ``grad_accum`` micro-batches of ``micro_batch`` clips on every rank. Per
micro-batch: one grid index i ~ U{0..999}, t = t_i; x_t from the TI2V inputs (cell 0 clean); loss =
MSE(v̂, ε − x0) over cells 1..20 × w(t). Noise and t come from generators seeded by (seed, rank,
step, micro), so a resumed run draws exactly what an uninterrupted one does.

Everything else is the shared training core (train.loop, .engine, .state, .data, .validation):
this file is the step's math, its validation and its export.

Bit-identical resume (deterministic mode) needs the consumer to re-deal the remaining shards the way
the uninterrupted run had them: equal-size shards consumed in lockstep, ``num_workers`` ≤ 1, the same
world size; on CPU also a fixed single intra-op thread (torchrun's default OMP_NUM_THREADS=1).
Otherwise resume is still exactly-once (no sample lost or repeated) but the order after the restart
may differ. The snapshot stays pinned for the whole run (new snapshots go to new runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gc25d_core.checkpoint import step_name
from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import barrier
from gc25d_core.report import Reporter
from gc25d_core.train.config import SftConfig
from gc25d_core.train.data import TextBank, TrainingStream, batch_of, generator, load_text_table
from gc25d_core.train.engine import Trained, build_engine
from gc25d_core.train.inputs import cell_mse, model_kwargs, ti2v_inputs
from gc25d_core.train.loop import StageRun
from gc25d_core.train.metrics import JsonlLog, StepSums
from gc25d_core.train.model import build_model, last_stats, param_groups
from gc25d_core.train.presets import stage_config, with_stage
from gc25d_core.train.state import ResumePoint, RngState, Stateful
from gc25d_core.train.validation import VAL_MODES, load_val_clips, validate_modes

__all__ = ["SftConfig", "SftRun", "run_sft", "sft_config", "with_sft"]

# what a step sums over micro-batches and ranks: kept on the device (one sync per step) / on the host
DEVICE_SUMS = ("loss", "mse", "sem_rms", "x_rms")
HOST_SUMS = ("t", "text_dropped", "cond_dropped", "masked", "samples", "masked_frac", "data_s")


def sft_config(cfg: Gc25dConfig) -> SftConfig:
    return stage_config(cfg, "sft")


def with_sft(cfg: Gc25dConfig, section: str | dict[str, Any], overrides: dict[str, Any] | None = None):
    """``cfg`` with ``sft`` = configs/sft/<section>.yaml (or a dict), deep-merged with overrides."""
    return with_stage(cfg, "sft", section, overrides)


class SftRun(StageRun):
    name = "sft"
    section: SftConfig

    def build(self, resume: ResumePoint) -> None:
        sft = self.section
        self.data = TrainingStream(
            self.cfg,
            sft.data,
            sft.dropout,
            seed=sft.seed,
            micro_batch=sft.micro_batch,
            device=self.device,
            resume=resume.data,
        )
        self.text = TextBank(load_text_table(self.cfg, sft.data), self.device)
        self.engine = build_engine(sft, self.device, self.precision)
        model = build_model(self.cfg, sft.model, self.device, self.engine.build_dtype)
        self.dit_config = model.gc_config
        groups = lambda m: param_groups(m, sft.optim.lr, sft.optim.cond_lr)  # noqa: E731
        self.model: Trained = self.engine.train("model", model, sft.optim, groups)
        self.val_clips = load_val_clips(
            self.data.store, self.data.manifest_ref, sft.val, self.data.prompt_to_key, self.cfg.vocab
        )
        if not self.val_clips:
            self.rep.log("the snapshot has no val clips: validation is skipped", level="warning")

    def state_parts(self) -> dict[str, Stateful]:
        return {"model": self.model, "rng": RngState()}

    def data_state(self) -> dict[str, Any]:
        return self.data.state()

    def state_meta(self) -> dict[str, Any]:
        return {
            **super().state_meta(),
            "epoch": self.data.epoch,
            "epoch_budget": self.data.epoch_budget,
            "manifest": self.data.manifest_ref.model_dump(),
        }

    def describe(self) -> str:
        return f", snapshot {self.data.manifest_ref.snapshot_id}, {len(self.val_clips)} val clips"

    def summary(self) -> dict[str, Any]:
        val_curve = [
            {k: r[k] for k in ("step", *(f"{m}_mse" for m in VAL_MODES)) if k in r}
            for r in self.val_log.records()
        ]
        ref = self.data.manifest_ref
        return {"snapshot": ref.snapshot_id, "manifest_sha256": ref.sha256, "val_curve": val_curve}

    # -- the step ---------------------------------------------------------------------------------

    def _kwargs(
        self, x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor
    ) -> dict[str, Any]:
        dtype = next(self.model.module.parameters()).dtype
        return model_kwargs(self.text, x_t, t, keys, ids, dtype=dtype, device=self.device)

    def train_step(self, step: int) -> dict[str, float]:
        """grad_accum micro-batches, then mark them consumed. An epoch budget that is not a multiple
        of grad_accum ends the epoch inside a step: the closing epoch's keys are marked first."""
        sft, ga = self.section, self.section.grad_accum
        sums = StepSums(DEVICE_SUMS + ("grad_norm",), HOST_SUMS, self.device)
        keys_done: list[Any] = []
        for micro in range(ga):
            if self.data.epoch_ends and keys_done:
                self.data.mark_consumed(keys_done)
                keys_done = []
            t_data = time.perf_counter()
            items = self.data.next_micro()
            data_s = time.perf_counter() - t_data
            samples = [s for _, s in items]
            keys_done += [k for k, _ in items]
            gen = generator(sft.seed, "train", self.rank, step, micro)
            idx = int(self.schedule.sample_index(gen)[0])
            t, w = float(self.schedule.timesteps[idx]), float(self.schedule.weights[idx])
            latent, ids = batch_of([s.latent for s in samples]), batch_of([s.ids for s in samples])
            _, x_t, target = ti2v_inputs(self.schedule, latent, t, gen, self.device)
            boundary = micro == ga - 1
            with self.model.accumulate(boundary):
                pred = self.model(
                    **self._kwargs(x_t, t, [s.keys for s in samples], ids),
                    use_gradient_checkpointing=sft.model.gradient_checkpointing,
                    checkpoint_blocks=sft.model.checkpoint_blocks,
                )
                mse = cell_mse(pred, target)
                loss = mse * w
                self.model.backward(loss)
            grad_norm = self.model.step(boundary)
            st, zero = last_stats(self.model.module), torch.zeros((), device=self.device)
            norm = grad_norm.to(self.device) / self.world if grad_norm is not None else zero
            sums.add_device([loss, mse, st.get("sem_rms", zero), st.get("x_rms", zero), norm])
            sums.add_host(
                [
                    t,
                    sum(s.text_dropped for s in samples),
                    sum(s.cond_dropped for s in samples),
                    sum(s.masked for s in samples),
                    len(samples),
                    sum(s.masked_frac for s in samples),
                    data_s,
                ]
            )
        self.data.mark_consumed(keys_done)
        tot = sums.reduce()
        n_micro, n_samples = ga * self.world, tot["samples"]
        lr, cond_lr = self.model.lrs()
        return {
            "loss": tot["loss"] / n_micro,
            "mse": tot["mse"] / n_micro,
            "t_mean": tot["t"] / n_micro,
            "sem_rms": tot["sem_rms"] / n_micro,
            "x_rms": tot["x_rms"] / n_micro,
            "frac_text_dropped": tot["text_dropped"] / n_samples,
            "frac_cond_dropped": tot["cond_dropped"] / n_samples,
            "frac_masked": tot["masked"] / n_samples,
            # of the masked samples
            "masked_static_frac": tot["masked_frac"] / tot["masked"] if tot["masked"] else 0.0,
            # host seconds a rank waited for its micro-batches (mean over ranks): the data pipeline
            # keeps up while this stays near 0
            "data_wait_s": tot["data_s"] / self.world,
            "grad_norm": tot["grad_norm"],  # the global norm (the same on every rank; averaged)
            "lr": lr,
            "cond_lr": cond_lr,
            "epoch": self.data.epoch,
        }

    def validate(self, step: int) -> dict[str, float] | None:
        if not self.val_clips:
            return None
        module = self.model.module
        module.eval()

        def predict(x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor) -> torch.Tensor:
            return self.model.infer(**self._kwargs(x_t, t, keys, ids))

        def sem_rms() -> float:
            return float(last_stats(module).get("sem_rms", torch.tensor(0.0)))

        out = validate_modes(self.val_clips, self.section.val, self.schedule, predict, self.device, sem_rms)
        module.train()
        return out

    def export(self, step: int) -> list[Path]:
        from gc25d_core.models.export import save_export

        path = self.export_dir / f"{step_name(step)}.safetensors"
        weights = self.model.full_state_dict()
        if self.rank == 0:
            save_export(
                path,
                weights,
                dit_config=self.dit_config,
                data=self.section.data_tag,
                extra={
                    "stage": "sft",
                    "step": str(step),
                    "flow": json.dumps(self.schedule.describe(), sort_keys=True),
                },
            )
        barrier()
        return [path]


def run_sft(
    cfg: Gc25dConfig,
    run_dir: Path | str,
    reporter: Reporter,
    *,
    max_steps: int | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """Train (or resume) SFT in ``run_dir`` up to ``max_steps`` (default the config's); every rank
    calls it inside an initialised process group. Returns the summary rank 0 also materializes."""
    return SftRun(cfg, sft_config(cfg), Path(run_dir), reporter, fresh=fresh).run(max_steps)


def iter_val_records(run_dir: Path | str) -> Iterator[dict[str, Any]]:
    yield from JsonlLog(Path(run_dir) / "val.jsonl", False).records()
