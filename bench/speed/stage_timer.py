"""A stage job (``gc25d_core.jobs.train --stage <stage>``) with the phases of each optimizer step timed (bench-side).

    torchrun --nproc_per_node=N -m bench.speed.stage_timer <stage> --config C --run-dir D [--fresh]

runs the job's own entry point unchanged after wrapping a few methods of the stage's classes, and
rank 0 appends one record per step to ``<run_dir>/phases.jsonl``: the step's seconds and, summed
over the step, the seconds (and call counts) of

    micro_loss        every stage: the micro-batch's forward(s) (the stage's math, no backward)
    teacher_fwd       stage 2: the frozen teacher's forwards (no grad)
    ema_fwd           stage 2: the target network's forwards (no grad)
    rollout_nograd    stage 3: the critic updates' rollouts (no grad)
    rollout_grad      stage 3: the generator update's rollout (the last K cells hold the graph)
    exit_fwd_grad     stage 3, fast path: the generator rollout's exit forwards with grad (inside rollout_grad)
    critic_fwd        stage 3: the critic's no-grad score in the generator update
    real_fwd          stage 3: the real score's forward
    critic_step       stage 3: one critic update (rollout + forward + backward + optimizer)
    generator_step    stage 3: the generator update (rollout + scores + backward + optimizer)

Each timed region is bracketed by ``torch.cuda.synchronize`` (a few ms per step of lost overlap at
most; the stage's own ``time_phases`` does the same). Stage 3 also records the step's rollout draws
(cells, exit step), the allocated memory at the step's start and the peak so far.
"""

from __future__ import annotations

import contextlib
import functools
import json
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gc25d_core.train.gpu_trace import PHASE_PREFIX


def _sync() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


class Phases:
    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def add(self, key: str, dt: float) -> None:
        self.s[key] = self.s.get(key, 0.0) + dt
        self.n[key] = self.n.get(key, 0) + 1

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        """The body's seconds, synced at both ends, add to ``key``; in a profiled step the body is
        the trace's range ``phase:<key>`` (train.gpu_trace.phase_summary reads it)."""
        t0 = _sync()
        with torch.profiler.record_function(PHASE_PREFIX + key):
            yield
            t1 = _sync()
        self.add(key, t1 - t0)


_ACTIVE: list[Phases] = []  # the timed step's phases (empty outside a timed step)


def _timed(cls: type, name: str, label: Callable[..., str] | str) -> None:
    """Wrap ``cls.name`` so that, inside a timed step, its seconds add to the phase ``label``."""
    orig = getattr(cls, name)

    @functools.wraps(orig)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return orig(self, *args, **kwargs)
        with _ACTIVE[-1].timed(label if isinstance(label, str) else label(self, *args, **kwargs)):
            return orig(self, *args, **kwargs)

    setattr(cls, name, wrapper)


def _timed_grad_forwards() -> None:
    """Stage 3's fast path: each exit forward that carries gradients (``fast_rollout._Route`` sends
    it to the training module; batched: ``ExitCapture.forward``, one over the K cells) adds to
    ``exit_fwd_grad``, inside the generator's rollout."""
    from gc25d_core.models.fast_rollout import ExitCapture, _Route

    _timed(ExitCapture, "forward", "exit_fwd_grad")

    orig = _Route.__call__

    @functools.wraps(orig)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE or not torch.is_grad_enabled():
            return orig(self, *args, **kwargs)
        with _ACTIVE[-1].timed("exit_fwd_grad"):
            return orig(self, *args, **kwargs)

    _Route.__call__ = call  # type: ignore[method-assign]


def _timed_step(cls: type) -> None:
    orig = cls.train_step

    @functools.wraps(orig)
    def train_step(self: Any, step: int) -> dict[str, float]:
        cuda = torch.cuda.is_available()
        mem0 = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
        ph = Phases()
        _ACTIVE.append(ph)
        t0 = _sync()
        try:
            with torch.profiler.record_function(PHASE_PREFIX + "step"):
                return orig(self, step)
        finally:
            dt = _sync() - t0
            _ACTIVE.remove(ph)
            if self.rank == 0:
                rec = {
                    "step": step,
                    "step_s": dt,
                    "s": ph.s,
                    "n": ph.n,
                    "mem_start_gib": mem0,
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                    "draws": [list(d) for d in getattr(self, "draws", [])],
                }
                with (self.run_dir / "phases.jsonl").open("a") as f:
                    f.write(json.dumps(rec) + "\n")

    cls.train_step = train_step


def _stage2_velocity(cls: type) -> None:
    """Stage 2's teacher and target forwards go through ``_velocity``'s closures: time those."""
    orig = cls._velocity

    def _velocity(self: Any, module: Any, *args: Any) -> Any:
        v = orig(self, module, *args)
        label = "teacher_fwd" if module is self.teacher else "ema_fwd"

        def timed_v(x_t: torch.Tensor, t: float) -> torch.Tensor:
            if not _ACTIVE:
                return v(x_t, t)
            with _ACTIVE[-1].timed(label):
                return v(x_t, t)

        return timed_v

    cls._velocity = _velocity


def install(stage: str) -> None:
    if stage == "sft":
        from gc25d_core.train.sft import SftRun as Run
    elif stage == "stage1_tf":
        from gc25d_core.train.stage1_tf import Stage1Run as Run
    elif stage == "stage2_cd":
        from gc25d_core.train.stage2_cd import Stage2Run as Run
    elif stage == "stage3_dmd":
        from gc25d_core.train.stage3_dmd import Stage3Run as Run
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    _timed_step(Run)
    if stage != "stage3_dmd":
        _timed(Run, "micro_loss", "micro_loss")
    if stage == "stage2_cd":
        _stage2_velocity(Run)
    if stage == "stage3_dmd":
        _timed_grad_forwards()
        _timed(
            Run,
            "rollout_groups",
            lambda self, *a, grad=False, **k: "rollout_grad" if grad else "rollout_nograd",
        )
        # batch_critic_rollouts: the critic updates' rollouts, before the first update's micro-step
        _timed(Run, "roll_critic_clips", "critic_prefetch")
        _timed(Run, "_score", lambda self, net, *a, **k: "real_fwd" if net is self.real else "critic_fwd")
        # a phase's micro-step: its forward(s), backward and optimizer step (train.denoiser.Phase)
        _timed(Run, "micro_step", lambda self, phase, *a, **k: f"{phase.stream}_step")


def main() -> None:
    stage, *rest = sys.argv[1:]
    install(stage)
    sys.argv = ["gc25d_core.jobs.train", "--stage", stage, *rest]
    runpy.run_module("gc25d_core.jobs.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
