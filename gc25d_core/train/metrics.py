"""Step records: JSON-lines logs and TensorBoard event files (rank 0), sums over micro-batches and
ranks in one host sync, the step profiler, the curves of a run as one PNG."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.distributed import all_reduce
from gc25d_core.stage_config import ProfileConfig


class JsonlLog:
    """Append-only JSON lines (rank 0); ``truncate_after(step)`` drops records a resume will redo."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled

    def append(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        if self.enabled and self.path.is_file():
            kept = [r for r in self.records() if int(r.get("step", 0)) <= step]
            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


class TensorBoardLog:
    """TensorBoard event files in ``folder`` (rank 0): each numeric entry of a record as the scalar
    ``<prefix>/<key>`` at its step (``train/loss``, ``train/lr``, ``val/cond_mse_t500``, …).

    ``purge_step`` (a resume's first step) drops the events at and after it that an earlier attempt
    wrote past the state it resumes from, as ``JsonlLog.truncate_after`` does for the JSON lines."""

    def __init__(self, folder: Path, enabled: bool, purge_step: int | None = None):
        self.writer: Any = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder), purge_step=purge_step, flush_secs=10)

    def scalars(self, prefix: str, step: int, record: Mapping[str, Any]) -> None:
        if self.writer is None:
            return
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{key}", float(value), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# (title, keys, log y): the panels of curves_png; a key a stage does not log is left out
CURVE_PANELS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("train loss", ("loss", "critic_loss", "gen_loss"), True),
    ("learning rate", ("lr",), False),
    ("grad norm", ("grad_norm",), True),
    ("samples / s", ("samples_per_s",), False),
)


def curves_png(train: Sequence[Mapping[str, Any]], val: Sequence[Mapping[str, Any]]) -> bytes | None:
    """A run's curves over optimizer steps, one panel each: the CURVE_PANELS of the train records and
    the validation MSE per mode (mean over t) and per t of the cond mode. None when nothing is logged."""
    from gc25d_core.plots import line_plot_png, stack_png

    def panel(title: str, records: Sequence[Mapping[str, Any]], keys: Sequence[str], log_y: bool):
        series = {k: [r.get(k) for r in records] for k in keys if any(k in r for r in records)}
        if not series:
            return None
        steps = [float(r.get("step", 0)) for r in records]
        return line_plot_png(
            series, title, title, x={k: steps for k in series}, log_y=log_y, xlabel="step", size=(760, 260)
        )

    val_keys = sorted({k for r in val for k in r})
    panels = [panel(t, train, keys, log_y) for t, keys, log_y in CURVE_PANELS]
    panels.append(panel("val MSE per mode", val, [k for k in val_keys if k.endswith("_mse")], True))
    panels.append(panel("val cond MSE per t", val, [k for k in val_keys if k.startswith("cond_mse_t")], True))
    drawn = [p for p in panels if p is not None]
    return stack_png(drawn) if drawn else None


class StepSums:
    """Per-step sums: device values stay on the device (one host sync per step, in ``reduce``),
    host values on the host; ``reduce`` all-reduces both over the ranks in one collective."""

    def __init__(self, device_keys: Sequence[str], host_keys: Sequence[str], device: torch.device):
        self.device_keys, self.host_keys, self.device = tuple(device_keys), tuple(host_keys), device
        self.on_device = torch.zeros(len(self.device_keys), dtype=torch.float64, device=device)
        self.on_host = np.zeros(len(self.host_keys))

    def add_device(self, values: Sequence[torch.Tensor]) -> None:
        """Scalars of any device (a constant zero may live on the host): gathered onto ours."""
        self.on_device += torch.stack([v.detach().reshape(()).to(self.on_device) for v in values])

    def add_host(self, values: Sequence[float]) -> None:
        self.on_host += np.asarray(values, dtype=np.float64)

    def reduce(self) -> dict[str, float]:
        flat = self.on_device.tolist() + self.on_host.tolist()
        return dict(zip(self.device_keys + self.host_keys, all_reduce(flat, self.device), strict=True))


class StepProfiler:
    """torch.profiler over optimizer steps [start, start + steps) on rank 0: writes the kernel table
    (``ops.txt``, by device time), a Chrome trace and the GPU's busy time and idle gaps over the
    window (``gpu_busy.json``, train.gpu_trace) to ``folder``. Inactive when start is 0."""

    def __init__(self, cfg: ProfileConfig, folder: Path, enabled: bool):
        self.first, self.last = cfg.start, cfg.start + cfg.steps - 1
        self.folder, self.enabled = folder, enabled and cfg.start > 0
        self.prof: Any = None

    def before(self, step: int) -> None:
        if self.enabled and step == self.first:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts, record_shapes=False)
            self.prof.start()

    def after(self, step: int) -> None:
        if self.prof is None or step != self.last:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = self.prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=70)
        atomic_write_text(self.folder / "ops.txt", table)
        trace = self.folder / "trace.json"
        self.prof.export_chrome_trace(str(trace))
        self.prof = None
        from gc25d_core.train.gpu_trace import (
            busy_summary,
            device_intervals,
            device_time_by_kind,
            phase_summary,
        )

        events = json.loads(trace.read_text())
        busy = busy_summary(device_intervals(events))
        busy["per_step_by_kind"] = device_time_by_kind(events, per=self.last - self.first + 1)
        phases = phase_summary(events)  # labelled ranges (a bench's phase timer), if any
        if phases:
            busy["phases"] = phases
        atomic_write_text(self.folder / "gpu_busy.json", json.dumps(busy, indent=1))
