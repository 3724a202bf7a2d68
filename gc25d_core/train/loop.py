"""The training loop every stage shares: run folder, determinism, resume, cadences, reporting.

A stage subclasses ``StageRun`` and writes its math: ``build`` (models, engines, data), ``train_step``
(one optimizer step, returning its record), ``validate``, ``export``, ``state_parts``. The stages on the
training stream get ``train_step`` from train.denoiser, as optimizer phases over their micro-batch
losses. The loop does the rest the same way for every stage::

    <run_dir>/config.yaml               the resolved run config (one per run folder)
    <run_dir>/deepspeed.json, accelerate.yaml   the engine's generated configs (relaunch by hand)
    <run_dir>/exports/step-001000*.safetensors  exports (export_every, and the last step)
    <run_dir>/state/step-000500/        rotating full state (train.state), exactly state_slots kept
    <run_dir>/state/damaged-step-000600/  a slot that failed its check at resume, kept for inspection
    <run_dir>/metrics.jsonl  val.jsonl  train / validation records (rank 0)
    <run_dir>/tensorboard/              the same records as TensorBoard scalars (rank 0)
    <run_dir>/done.json                 written when max_steps is reached (with the box's numerics)
    <run_dir>/final.json                the hand-off to the next stage (gc25d_core.handoff)
    <run_dir>/.lock                     held by the job running in the folder (gc25d_core.run_lock)

Resume is the default: the newest state slot that verifies restores every part and the logs past its
step are dropped; ``fresh`` deletes state, exports and logs first. A fault hook (``GC25D_FAULT``) can kill a
rank at a chosen step, which the resume tests use.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.checkpoint import step_name
from gc25d_core.config import Gc25dConfig, to_yaml
from gc25d_core.distributed import barrier, global_rank, pick_device, world_size
from gc25d_core.faults import maybe_inject_fault
from gc25d_core.flow import WAN_SCHEDULE, FlowSchedule
from gc25d_core.handoff import FINAL, TEACHER
from gc25d_core.numerics import numerics_differ, numerics_record
from gc25d_core.report import Reporter
from gc25d_core.stage_config import StageConfig
from gc25d_core.train.engine import Engine
from gc25d_core.train.metrics import JsonlLog, StepProfiler, TensorBoardLog
from gc25d_core.train.model import resolve_precision, set_determinism
from gc25d_core.train.state import ResumePoint, RunState, Stateful

DONE_FILE = "done.json"  # the summary of a run that reached its max_steps

LOG_FILES = ("metrics.jsonl", "val.jsonl")
TENSORBOARD_DIR = "tensorboard"


class StageRun:
    """One stage's run in ``run_dir``; every rank constructs it inside an initialised process group."""

    name: ClassVar[str]  # the stage: "sft", "stage1_tf", ...
    engine: Engine

    def __init__(
        self, cfg: Gc25dConfig, section: StageConfig, run_dir: Path, reporter: Reporter, *, fresh=False
    ):
        self.cfg, self.section = cfg, section
        self.run_dir = Path(run_dir)
        self.rep = reporter
        self.rank, self.world_size = global_rank(), world_size()
        self.fresh = fresh
        self.schedule: FlowSchedule = WAN_SCHEDULE
        self.device = pick_device(cfg)
        self.precision = resolve_precision(section, self.device)
        self.state = RunState(self.run_dir / "state", section.state_slots)
        self.export_dir = self.run_dir / "exports"
        self.metrics = JsonlLog(self.run_dir / "metrics.jsonl", self.rank == 0)
        self.val_log = JsonlLog(self.run_dir / "val.jsonl", self.rank == 0)

    # -- what a stage writes ----------------------------------------------------------------------

    def build(self, resume: ResumePoint) -> None:
        """Models, engine(s), data (the cursor in ``resume.data``), validation clips."""
        raise NotImplementedError

    def train_step(self, step: int) -> dict[str, float]:
        """Optimizer step ``step`` (1-based); returns its record (reduced over ranks)."""
        raise NotImplementedError

    def validate(self, step: int) -> dict[str, float] | None:
        """Validation record, or None when the stage has nothing to validate on."""
        return None

    def export(self, step: int) -> list[Path]:
        """Collective: write this step's exports; returns their paths."""
        raise NotImplementedError

    def state_parts(self) -> dict[str, Stateful]:
        raise NotImplementedError

    def data_state(self) -> dict[str, Any]:
        """Collective: the data cursor of every rank."""
        raise NotImplementedError

    def state_meta(self) -> dict[str, Any]:
        """What ``trainer.json`` records beside the step (the stage adds epoch, snapshot, ...)."""
        return {
            "stage": self.name,
            "init": self._init_identity(),
            "engine": self.section.engine,
            "precision": self.precision,
            "world_size": self.world_size,
            "micro_batch": self.section.micro_batch,
            "grad_accum": self.section.grad_accum,
            "seed": self.section.seed,
            # not a resume key: a run may go on elsewhere, but not to the bit (warned at resume)
            "numerics": numerics_record(self.device.type),
        }

    def _init_identity(self) -> str:
        """What the weights started from: a resume must not continue a run begun from another
        teacher (a re-pick rewrites teacher.json, not the state)."""
        m = self.section.model
        if m.init in ("export", "handoff"):
            from gc25d_core.train.model import init_export

            path, sha = init_export(m, self.cfg.paths.runs_root)
            return f"{m.init}:{sha or path}"
        return f"{m.init}:{m.init_seed}" if m.init == "random" else f"{m.init}:{m.wan_dir}"

    def describe(self) -> str:
        return ""

    def summary(self) -> dict[str, Any]:
        """The stage's entries of the final summary (snapshot, ...)."""
        return {}

    # -- the loop ---------------------------------------------------------------------------------

    def _prepare_run_dir(self) -> None:
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if self.fresh:
                for name in ("state", "exports", TENSORBOARD_DIR):
                    shutil.rmtree(self.run_dir / name, ignore_errors=True)
                # a fresh run invalidates its hand-offs: the next stage must not start from them
                for name in (*LOG_FILES, DONE_FILE, FINAL, TEACHER):
                    (self.run_dir / name).unlink(missing_ok=True)
            self.state.clean()
            self.export_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "config.yaml", to_yaml(self.cfg))
        barrier()

    def _write_engine_configs(self) -> None:
        if self.rank == 0:
            for name, text in self.engine.config_files(self.run_dir).items():
                atomic_write_text(self.run_dir / name, text)

    def save_state(self, step: int) -> Path:
        return self.state.save(step, self.state_parts(), self.state_meta(), self.data_state())

    def _resume(self) -> ResumePoint:
        # the base meta: what a slot must match (the stage's additions need its built parts)
        return self.state.resume_point(StageRun.state_meta(self), fresh=self.fresh)

    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        sec = self.section
        set_determinism(sec.deterministic, sec.seed + self.rank)
        if sec.deterministic and sec.data.num_workers > 1:
            self.rep.log(
                "deterministic mode with num_workers > 1: a resumed run may see samples in another order",
                level="warning",
            )
        self._prepare_run_dir()
        point = self._resume()
        if self.rank == 0:
            for slot in point.damaged:
                self.rep.log(
                    f"state slot {slot.folder} is damaged and was not resumed from ({slot.reason}); kept "
                    f"as {slot.set_aside_as} for inspection; resuming from {point.folder} instead",
                    level="warning",
                )
        self.build(point)
        self._write_engine_configs()
        if point.folder is not None:
            self.state.load(point, self.state_parts())
            self.rep.log(f"resumed from {point.folder} (step {point.step})")
            if self.rank == 0 and (
                why := numerics_differ(point.meta.get("numerics"), numerics_record(self.device.type))
            ):
                self.rep.log(
                    f"{point.folder} was saved under other numerics ({why}): the steps from here round "
                    "differently from an uninterrupted run's and will not match it to the bit",
                    level="warning",
                )
        start_step = point.step
        # records and events past the resumed state were written by an attempt whose steps are redone
        # (a start at step 0, also after an attempt killed before its first slot, redoes the step-0
        # validation too)
        if self.rank == 0:
            for log in (self.metrics, self.val_log):
                log.truncate_after(start_step if point.folder is not None else -1)
        purge = start_step + 1 if start_step else 0
        curves = TensorBoardLog(self.run_dir / TENSORBOARD_DIR, self.rank == 0, purge_step=purge)
        try:
            return self._loop(start_step, max_steps, curves)
        finally:
            curves.close()

    def _loop(self, start_step: int, max_steps: int | None, curves: TensorBoardLog) -> dict[str, Any]:
        sec = self.section
        target = sec.max_steps if max_steps is None else max_steps
        progress = self.rep.progress(total=target, unit="steps", every_s=10.0, start=start_step)
        samples_per_step = sec.micro_batch * sec.grad_accum * self.world_size
        self.rep.log(
            f"{self.name} {sec.engine} {self.precision} on {self.world_size} x {self.device.type}: steps "
            f"{start_step} -> {target}, {samples_per_step} clips/step{self.describe()}"
        )
        last_val: dict[str, float] = {}
        if sec.val.at_start and start_step == 0:  # the initial weights' numbers: the baseline
            val = self.validate(0)
            if val is not None:
                last_val = val
                self.val_log.append({"step": 0, **val})
                curves.scalars("val", 0, val)
                self.rep.metrics(step=0, **{f"val_{k}": v for k, v in val.items()})
        train_s, step = 0.0, start_step
        profiler = StepProfiler(sec.profile, self.run_dir / "profile", self.rank == 0)
        while step < target:
            maybe_inject_fault(step + 1, self.rep.retry_number)
            profiler.before(step + 1)
            t0 = time.perf_counter()
            record = self.train_step(step + 1)
            step += 1
            profiler.after(step)
            dt = time.perf_counter() - t0
            train_s += dt
            progress.update(1)
            final = step == target
            if step % sec.log_every == 0 or final:
                rate = (step - start_step) / train_s if train_s > 0 else 0.0
                record.update(
                    step=step,
                    step_s=dt,
                    samples_per_s=samples_per_step / dt if dt > 0 else 0.0,
                    eta_s=(target - step) / rate if rate > 0 else float("nan"),
                )
                if self.device.type == "cuda":
                    record["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
                self.metrics.append(record)
                curves.scalars("train", step, record)
                self.rep.metrics(step=step, **{k: v for k, v in record.items() if k != "step"})
            if step % sec.val.every == 0 or final:
                val = self.validate(step)
                if val is not None:
                    last_val = val
                    self.val_log.append({"step": step, **val})
                    curves.scalars("val", step, val)
                    self.rep.metrics(step=step, **{f"val_{k}": v for k, v in val.items()})
            if step % sec.export_every == 0 or (final and sec.export_final):
                self.export(step)
            if step % sec.state_every == 0 or (final and sec.state_final):
                self.save_state(step)
        return self._finish(start_step, step, target, last_val)

    def _finish(self, start_step: int, step: int, target: int, last_val: dict[str, float]) -> dict[str, Any]:
        from gc25d_core.handoff import runs_relative, write_handoff

        exports = sorted(p.name for p in self.export_dir.glob("step-*.safetensors"))
        summary: dict[str, Any] = {
            "stage": self.name,
            # relative to the runs root: the record stays true when the runs root moves
            "run_dir": runs_relative(self.run_dir, self.cfg.paths.runs_root),
            "final_step": step,
            "target_step": target,
            "max_steps": self.section.max_steps,
            "resumed_from_step": start_step,
            "engine": self.section.engine,
            "precision": self.precision,
            "world_size": self.world_size,
            "exports": exports,
            "state_slots": [step_name(s) for s in self.state.steps()],
            "last_val": last_val,
            # rank 0's CPU, kernels and torch: a CPU chain's digits hold only where these agree
            "numerics": numerics_record(self.device.type),
            **self.summary(),
        }
        if self.rank == 0 and step >= self.section.max_steps:
            atomic_write_text(self.run_dir / DONE_FILE, json.dumps(summary, sort_keys=True, indent=1))
            write_handoff(
                self.run_dir,
                self.name,
                step,
                self.export_dir,
                self.cfg.paths.runs_root,
                warn=lambda msg: self.rep.log(msg, level="warning"),
            )
        barrier()
        self.rep.materialize(
            summary, data_version=data_version(step, exports, summary.get("manifest_sha256"))
        )
        return summary


def data_version(step: int, exports: list[str], manifest_sha256: str | None) -> str:
    """A run's materialization version: its step, its exports and the snapshot it trained on."""
    return hashlib.sha256(json.dumps([step, exports, manifest_sha256]).encode()).hexdigest()[:16]


def finished_run(
    cfg: Gc25dConfig, stage: str, run_dir: Path | str, max_steps: int | None = None
) -> tuple[dict[str, Any], str] | None:
    """(done.json's summary, its data version) when a launch of ``stage`` in ``run_dir`` with ``cfg``
    (up to ``max_steps``, default the section's) would train nothing: the run finished at exactly
    that step with this very config (its config.yaml as the launch writes it) and its exports and
    hand-off are in place. None: the job has work to do (or checking it is the job's to do).

    The job itself resumes such a run and stops at once; asking here spares a launch its start-up
    (processes, imports, data, models) on a rerun with nothing changed."""
    from gc25d_core.train.presets import stage_config

    run_dir = Path(run_dir)
    try:
        done = json.loads((run_dir / DONE_FILE).read_text())
        written = (run_dir / "config.yaml").read_text()
    except (OSError, ValueError):
        return None
    target = max_steps if max_steps is not None else stage_config(cfg, stage).max_steps
    if not isinstance(done, dict) or done.get("stage") != stage or done.get("final_step") != target:
        return None
    exports = done.get("exports")
    if written != to_yaml(cfg) or not isinstance(exports, list) or not (run_dir / FINAL).is_file():
        return None
    if not all((run_dir / "exports" / str(e)).is_file() for e in exports):
        return None
    return done, data_version(target, exports, done.get("manifest_sha256"))


def run_stage(
    cfg: Gc25dConfig,
    stage: str,
    run_dir: Path | str,
    reporter: Reporter,
    *,
    max_steps: int | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    """Train (or resume) ``stage`` in ``run_dir`` up to ``max_steps`` (default its section's); every
    rank calls it inside an initialised process group. Returns the summary rank 0 also materializes."""
    from gc25d_core.stages import stage as stage_entry
    from gc25d_core.train.presets import stage_config

    # the table names the run class by import path: only the stage that runs imports its math
    run_cls = stage_entry(stage).run_class()
    return run_cls(cfg, stage_config(cfg, stage), Path(run_dir), reporter, fresh=fresh).run(max_steps)
