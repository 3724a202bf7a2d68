"""What the stages that train one GcDiT on the cache stream share (SFT, stage 1 teacher forcing).

``DenoiserRun`` builds the pinned training stream, the text bank, the engine and the one trained
model (its init from the section: random, Wan2.2, an export or a hand-off), the validation clips,
and runs the optimizer step as a list of optimizer phases (``Phase``): each names the trained
model it updates, the micro-batch function (the stage's math: forward(s) and loss) and how many
updates of how many micro-batches it takes per step; the step runs their micro-step bookkeeping
(fresh micro-batches, seeded draws, accumulation, backward, optimizer step, sums over micro-batches
and ranks in one host sync). The one-model stages have one phase, ``grad_accum`` micro-batches of
``micro_loss`` into one update; stage 3 has the critic's updates, then the generator's. A stage
file writes ``micro_loss`` (or its phases) and, where it has them, extra validation and export
metadata.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gc25d_core.checkpoint import step_name
from gc25d_core.distributed import barrier
from gc25d_core.stage_config import StageConfig
from gc25d_core.text import TextBank, load_text_table
from gc25d_core.train.data import TrainingSample, TrainingStream, batch_of, generator
from gc25d_core.train.ema import Ema
from gc25d_core.train.engine import Trained, build_engine
from gc25d_core.train.inputs import model_kwargs, to_device
from gc25d_core.train.loop import StageRun
from gc25d_core.train.metrics import StepSums
from gc25d_core.train.model import build_model, init_export, last_stats, param_groups
from gc25d_core.train.state import ResumePoint, RngState, Stateful
from gc25d_core.train.validation import VAL_MODES, load_val_clips, validate_modes


class MicroLoss(NamedTuple):
    loss: torch.Tensor  # what is back-propagated
    mse: torch.Tensor  # the unweighted velocity MSE (logged)
    t_mean: float  # the micro-batch's mean timestep over its noisy cells (logged)


class Micro(NamedTuple):
    """What a phase's micro-batch function gives the step: the loss to back-propagate and its
    numbers, summed over the step's micro-batches and ranks under the names the stage declares
    (``DEVICE_SUMS`` / ``HOST_SUMS``; a name a micro-batch leaves out adds 0)."""

    loss: torch.Tensor
    sums: dict[str, torch.Tensor]  # device scalars (one host sync per step)
    host: dict[str, float]


# (samples, gen, step, update) -> Micro: one micro-batch's forward(s) and loss, no backward
MicroFn = Callable[[list[TrainingSample], torch.Generator, int, int], Micro]


def _by_micro(update: int, micro: int) -> tuple[int, ...]:
    return (micro,)


@dataclass(frozen=True)
class Phase:
    """One optimizer phase of a training step: ``updates`` optimizer steps of ``trained``, each
    over ``micro_batches`` fresh micro-batches whose ``micro`` losses accumulate into it.

    A micro-batch's random draws come from ``generator(seed, stream, rank, step, *key(update,
    micro))``, so a resumed run redraws them exactly. ``grad_norm`` names the device sum the
    update's pre-clip global norm (over the world size) adds to; None leaves it unrecorded.

    ``prefetch``: called with every micro-batch of the phase (its samples and its generator, in
    order) before the first one runs — for work the micro-batches can share (stage 3 rolls out
    all its critic updates' clips in one batch); each micro-batch then gets the same generator."""

    stream: str
    trained: Trained
    micro: MicroFn
    updates: int = 1
    micro_batches: int = 1
    grad_norm: str | None = "grad_norm"
    key: Callable[[int, int], tuple[int, ...]] = _by_micro
    prefetch: Callable[[int, list[tuple[list[TrainingSample], torch.Generator]]], None] | None = None


class DenoiserRun(StageRun):
    section: StageConfig
    ema: Ema | None = None  # a stage that keeps one sets it in build: saved, updated and exported here
    # the kind of export an export / hand-off init must be: causal (True), bidirectional (False), either
    init_causal: bool | None = None
    kv_forwards = False  # the trained model also runs KV-cache forwards (stage 3's rollouts)
    # what a step sums over micro-batches and ranks: kept on the device (one sync per step) / on the
    # host; the host's "data_s" (the wait for each micro-batch) is added by the step
    DEVICE_SUMS: tuple[str, ...] = ("loss", "mse", "sem_rms", "x_rms", "grad_norm")
    HOST_SUMS: tuple[str, ...] = ("t", "text_dropped", "cond_dropped", "masked", "samples", "masked_frac")
    sync_phases = False  # synchronise the device around each phase (its seconds in step_record)

    def build(self, resume: ResumePoint) -> None:
        self.open_stream(resume)
        self.build_models_and_validation()

    def open_stream(self, resume: ResumePoint, exclude: tuple[str, ...] = ()) -> None:
        """The pinned train split at the resumed cursor, less the ``exclude``d sample ids."""
        sec = self.section
        self.data = TrainingStream(
            self.cfg,
            sec.data,
            sec.dropout,
            seed=sec.seed,
            micro_batch=sec.micro_batch,
            device=self.device,
            resume=resume.data,
            exclude=exclude,
        )

    def clean_batch(
        self, samples: list[TrainingSample]
    ) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
        """x0 float32 on the device [B, 48, N, H, W], the raw ids [B, F, h, w] and per-cell keys."""
        latent, ids = batch_of([s.latent for s in samples]), batch_of([s.ids for s in samples])
        return to_device(latent, self.device).float(), ids, [s.keys for s in samples]

    def build_models_and_validation(self) -> None:
        """The text bank, engine, trained model and validation clips (after ``self.data``)."""
        sec = self.section
        self.text = TextBank(load_text_table(self.cfg, sec.data.text_table), self.device)
        self.engine = build_engine(sec, self.device, self.precision)
        model = build_model(
            self.cfg,
            sec.model,
            self.device,
            self.engine.build_dtype,
            section=f"{self.name}.model",
            causal=self.init_causal,
            kv_forwards=self.kv_forwards,
        )
        self.dit_config = model.gc_config
        groups = lambda m: param_groups(m, sec.optim.lr, sec.optim.cond_lr)  # noqa: E731
        if sec.engine == "zero2" and self.device.type == "cpu":
            from gc25d_core.train.zero2 import cpu_op_build_note

            if note := cpu_op_build_note():
                self.rep.log(note)
        self.model: Trained = self.engine.train("model", model, sec.optim, groups)
        self.val_clips = load_val_clips(
            self.data.store, self.data.manifest_ref, sec.val, self.data.prompt_to_key, self.cfg.vocab
        )
        if not self.val_clips:
            self.rep.log("the snapshot has no val clips: validation is skipped", level="warning")

    def state_parts(self) -> dict[str, Stateful]:
        parts: dict[str, Stateful] = {"model": self.model, "rng": RngState()}
        if self.ema is not None:
            parts["ema"] = self.ema
        return parts

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

    def kwargs(self, x_t: torch.Tensor, t: Any, keys: list[list[str]], ids: torch.Tensor) -> dict[str, Any]:
        """GcDiT's arguments; ``t`` one value per clip, or per cell [B, N]."""
        dtype = next(self.model.module.parameters()).dtype
        return model_kwargs(self.text, x_t, t, keys, ids, dtype=dtype, device=self.device)

    def checkpointing(self) -> dict[str, Any]:
        m = self.section.model
        return {
            "use_gradient_checkpointing": m.gradient_checkpointing,
            "checkpoint_blocks": m.checkpoint_blocks,
        }

    def micro_loss(self, samples: list[TrainingSample], gen: torch.Generator) -> MicroLoss:
        """The stage's math for one micro-batch (forward through ``self.model``; the caller backward)."""
        raise NotImplementedError

    def after_optimizer_step(self, step: int) -> None:
        """Called once the step's updates are applied: the EMA follows the trained model."""
        if self.ema is not None:
            self.ema.update(step)

    def phases(self) -> list[Phase]:
        """The optimizer phases of a step, in order: here one, ``grad_accum`` micro-batches of
        ``micro_loss`` into one update of ``self.model``."""
        return [Phase("train", self.model, self.denoiser_micro, micro_batches=self.section.grad_accum)]

    def denoiser_micro(
        self, samples: list[TrainingSample], gen: torch.Generator, step: int, update: int
    ) -> Micro:
        """The one phase's micro-batch: ``micro_loss``, the model's input statistics of that forward
        (its last) and the samples' dropout and masking counts."""
        out = self.micro_loss(samples, gen)
        st, zero = last_stats(self.model.module), torch.zeros((), device=self.device)
        sums = {
            "loss": out.loss,
            "mse": out.mse,
            "sem_rms": st.get("sem_rms", zero),
            "x_rms": st.get("x_rms", zero),
        }
        host = {
            "t": out.t_mean,
            "text_dropped": sum(s.text_dropped for s in samples),
            "cond_dropped": sum(s.cond_dropped for s in samples),
            "masked": sum(s.masked for s in samples),
            "samples": len(samples),
            "masked_frac": sum(s.masked_frac for s in samples),
        }
        return Micro(out.loss, sums, host)

    def train_step(self, step: int) -> dict[str, float]:
        """Every phase in turn, each micro-batch a fresh one from the stream, then mark them consumed.
        An epoch budget that is not a multiple of a step's micro-batches ends the epoch inside a
        step: the closing epoch's keys are marked first."""
        self.current_step = step
        sums = StepSums(self.DEVICE_SUMS, (*self.HOST_SUMS, "data_s"), self.device)
        seconds: dict[str, float] = {}
        keys_done: list[Any] = []

        def take() -> tuple[list[TrainingSample], float]:
            nonlocal keys_done
            if self.data.epoch_ends and keys_done:
                self.data.mark_consumed(keys_done)
                keys_done = []
            t_data = time.perf_counter()
            items = self.data.next_micro()
            keys_done += [k for k, _ in items]
            return [s for _, s in items], time.perf_counter() - t_data

        for phase in self.phases():
            t0 = self.sync()
            ats = [(u, m) for u in range(phase.updates) for m in range(phase.micro_batches)]
            if phase.prefetch is None:
                for at in ats:
                    self.micro_step(phase, step, at, *take(), sums)
            else:
                taken = [(at, *take(), self.micro_generator(phase, step, at)) for at in ats]
                phase.prefetch(step, [(samples, gen) for _, samples, _, gen in taken])
                for at, samples, data_s, gen in taken:
                    self.micro_step(phase, step, at, samples, data_s, sums, gen=gen)
            seconds[phase.stream] = self.sync() - t0
        self.data.mark_consumed(keys_done)
        self.after_optimizer_step(step)
        return self.step_record(sums.reduce(), seconds)

    def micro_step(
        self,
        phase: Phase,
        step: int,
        at: tuple[int, int],
        samples: list[TrainingSample],
        data_s: float,
        sums: StepSums,
        gen: torch.Generator | None = None,
    ) -> None:
        """Micro-batch ``at`` = (update, micro) of ``phase``: its loss forward and backward, the
        optimizer step after the update's last micro-batch; its numbers into the step's sums.
        ``gen``: its generator, if a prefetch drew from it already."""
        update, micro = at
        gen = gen if gen is not None else self.micro_generator(phase, step, at)
        boundary = micro == phase.micro_batches - 1
        with phase.trained.accumulate(boundary):
            out = phase.micro(samples, gen, step, update)
            phase.trained.backward(out.loss)
        grad_norm = phase.trained.step(boundary)
        device = dict(out.sums)
        if phase.grad_norm is not None:
            zero = torch.zeros((), device=self.device)
            device[phase.grad_norm] = (
                grad_norm.to(self.device) / self.world_size if grad_norm is not None else zero
            )
        unknown = sorted(set(device) - set(self.DEVICE_SUMS)) + sorted(set(out.host) - set(self.HOST_SUMS))
        if unknown:
            raise KeyError(
                f"{self.name}: phase {phase.stream!r} sums {unknown}, not in DEVICE_SUMS / HOST_SUMS"
            )
        zero = torch.zeros((), device=self.device)
        sums.add_device([device.get(k, zero) for k in self.DEVICE_SUMS])
        sums.add_host([out.host.get(k, 0.0) for k in self.HOST_SUMS] + [data_s])

    def micro_generator(self, phase: Phase, step: int, at: tuple[int, int]) -> torch.Generator:
        """Micro-batch ``at``'s random draws: a function of (seed, phase, rank, step, its key)."""
        return generator(self.section.seed, phase.stream, self.rank, step, *phase.key(*at))

    def sync(self) -> float:
        """The time; with ``sync_phases`` on a GPU after the device is done (phase timings)."""
        if self.sync_phases and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step_record(self, tot: dict[str, float], seconds: dict[str, float]) -> dict[str, float]:
        """The step's record from its sums over micro-batches and ranks and its phases' seconds."""
        n_micro, n_samples = self.section.grad_accum * self.world_size, tot["samples"]
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
            "data_wait_s": tot["data_s"] / self.world_size,
            "grad_norm": tot["grad_norm"],  # the global norm (the same on every rank; averaged)
            "lr": lr,
            "cond_lr": cond_lr,
            "epoch": self.data.epoch,
        }

    # -- validation and export --------------------------------------------------------------------

    def predict(
        self, x_t: torch.Tensor, t: float, keys: list[list[str]], ids: torch.Tensor, x0: torch.Tensor
    ) -> torch.Tensor:
        """The velocity the validation modes score (bidirectional; a causal stage overrides it)."""
        return self.model.infer(**self.kwargs(x_t, t, keys, ids))

    def extra_validation(self, step: int) -> dict[str, float]:
        return {}

    def validate(self, step: int) -> dict[str, float] | None:
        if not self.val_clips:
            return None
        module = self.model.module
        module.eval()

        def sem_rms() -> float:
            return float(last_stats(module).get("sem_rms", torch.tensor(0.0)))

        with torch.no_grad():
            out = validate_modes(
                self.val_clips, self.section.val, self.schedule, self.predict, self.device, sem_rms
            )
            out.update(self.extra_validation(step))
        module.train()
        return out

    def export_metadata(self, step: int) -> dict[str, Any]:
        """save_export's keyword arguments beyond the weights (a causal stage adds its keys)."""
        extra = {
            "stage": self.name,
            "step": str(step),
            "flow": json.dumps(self.schedule.describe(), sort_keys=True),
        }
        if self.ema is not None:
            ema = self.section.ema
            extra["ema"] = json.dumps({"decay": ema.decay, "start_step": ema.start_step})
        if self.section.model.init in ("export", "handoff"):
            # named relative to the runs root where it lies there, as hand-offs name exports
            path, sha = init_export(self.section.model, self.cfg.paths.runs_root)
            root = Path(self.cfg.paths.runs_root).resolve()
            name = path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path
            extra["init_ckpt"] = json.dumps({"path": str(name), "sha256": sha})
        return {"extra": extra}

    def export(self, step: int) -> list[Path]:
        """exports/step-N.safetensors, and exports/ema/step-N.safetensors for a stage with an EMA
        (collective: every rank gathers, rank 0 writes)."""
        from gc25d_core.models.export import save_export

        path = self.export_dir / f"{step_name(step)}.safetensors"
        outputs = [(path, self.model.full_state_dict(), "model")]
        if self.ema is not None:
            outputs.append((self.export_dir / "ema" / path.name, self.ema.full_state_dict(), "ema"))
        if self.rank == 0:
            for out, weights, which in outputs:
                meta = self.export_metadata(step)
                if self.ema is not None:
                    meta["extra"]["weights"] = which
                out.parent.mkdir(parents=True, exist_ok=True)
                save_export(out, weights, dit_config=self.dit_config, data=self.section.data_tag, **meta)
        barrier()
        return [out for out, _, _ in outputs]
