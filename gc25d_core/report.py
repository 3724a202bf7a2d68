"""Reporting for jobs: Dagster Pipes when launched by Dagster (global rank 0 only), stdout otherwise.

Only global rank 0 may open Pipes: when every rank opens it, each writes a materialization to the
same channel and the step fails ("Multiple materialize results", research/dagster_anchors.md A2.2).
Other ranks get a reporter that logs to stderr with a rank prefix and reports nothing.

    with open_reporter() as rep:
        rep.log("starting")
        bar = rep.progress(total=len(clips), unit="clips")
        bar.update(1)
        rep.metrics(step=10, loss=0.1)
        rep.materialize({"num_clips": 12}, data_version="abc")
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from gc25d_core.distributed import global_rank


class Reporter(Protocol):
    rank: int
    extras: dict[str, Any]
    retry_number: int

    def log(self, message: str, level: str = "info") -> None: ...

    def metrics(self, step: int | None = None, **values: float) -> None: ...

    def materialize(self, metadata: dict[str, Any], data_version: str | None = None) -> None: ...

    def progress(self, total: int, unit: str = "items", every_s: float = 5.0, start: int = 0) -> Progress: ...


class Progress:
    """Counts done / total; logs rate and ETA at most every ``every_s`` seconds and at the end.

    ``start`` is the count a resumed run begins at: it counts towards done / total but not towards
    the rate, which is this session's work over this session's time (a run resumed at 400 of 404
    has done 1 step in its first second, not 401), so the ETA is the remaining work at that rate.

    ``job_done`` (set by a sharded job on rank 0) turns this rank's count into the whole job's
    (``total`` is then the job's); ``label`` is appended to each line ("over 2 ranks")."""

    def __init__(
        self,
        reporter: Reporter,
        total: int,
        unit: str,
        every_s: float,
        start: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.reporter, self.total, self.unit, self.every_s = reporter, total, unit, every_s
        self.start = self.done = start
        self.clock = clock
        self.t0 = clock()
        self._last = -math.inf
        self.job_done: Callable[[int], int] | None = None
        self.label = ""

    def shown(self) -> int:
        return self.job_done(self.done) if self.job_done is not None else self.done

    def summary(self) -> dict[str, float]:
        done = self.shown()
        dt = self.clock() - self.t0
        rate = (done - self.start) / dt if dt > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else (0.0 if done >= self.total else float("nan"))
        return {"done": done, "total": self.total, "start": self.start, "per_s": rate, "eta_s": eta}

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        # with job_done, this rank's end is not the job's: the job logs its own last line
        final = self.job_done is None and self.done >= self.total
        if now - self._last >= self.every_s or final:
            self._last = now
            s = self.summary()
            eta = "?" if math.isnan(s["eta_s"]) else f"{s['eta_s']:.0f}s"
            resumed = f"resumed at {self.start}, " if self.start else ""
            self.reporter.log(
                f"{self.unit} {s['done']:.0f}/{self.total} ({resumed}{s['per_s']:.2f} {self.unit}/s, ETA {eta})"
                + (f" {self.label}" if self.label else ""),
                # rank 0 reports the job's progress; the other ranks' lines would repeat it
                level="info" if self.reporter.rank == 0 else "debug",
            )


def human_bytes(num: float) -> str:
    """1536 → "1.5 KiB" (binary units, 3 significant digits)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.3g} {unit}"
        num /= 1024
    raise AssertionError("unreachable")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


class BarProgress(Progress):
    """A tqdm bar on stderr for a person at a terminal; where stderr is not one (logs, CI) tqdm
    draws nothing and the rate lines of ``Progress`` are logged instead."""

    def __init__(self, reporter: Reporter, total: int, unit: str, every_s: float, start: int = 0):
        from tqdm import tqdm

        super().__init__(reporter, total, unit, every_s, start)
        # tqdm's rate counts from ``initial`` as ours counts from ``start``
        self.bar = tqdm(
            total=total, initial=start, unit=f" {unit}", file=sys.stderr, disable=None, dynamic_ncols=True
        )

    def update(self, n: int = 1) -> None:
        if self.bar.disable:
            super().update(n)
            return
        self.done += n
        self.bar.update(n)
        if self.done >= self.total:
            self.bar.close()


class StdoutReporter:
    """Standalone reporter: JSON lines on stdout from rank 0; other ranks log to stderr only.
    ``bars``: progress as tqdm bars (command lines a person waits on)."""

    def __init__(self, rank: int | None = None, extras: dict[str, Any] | None = None, bars: bool = False):
        self.rank = global_rank() if rank is None else rank
        self.extras = extras or {}
        self.retry_number = int(os.environ.get("GC25D_RETRY_NUMBER", "0"))
        self.materializations: list[dict[str, Any]] = []
        self.bars = bars

    def _emit(self, record: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        line = json.dumps(record, default=_json_default)
        if self.bars:
            from tqdm import tqdm

            tqdm.write(line, file=sys.stdout)  # above a bar that is being drawn
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def log(self, message: str, level: str = "info") -> None:
        if self.rank == 0:
            self._emit({"event": "log", "level": level, "message": message})
        elif level != "debug":  # stderr is the terminal (or the torchrun log): no debug lines there
            print(f"[rank {self.rank}] {level}: {message}", file=sys.stderr, flush=True)

    def metrics(self, step: int | None = None, **values: float) -> None:
        self._emit({"event": "metrics", "step": step, **values})

    def materialize(self, metadata: dict[str, Any], data_version: str | None = None) -> None:
        if self.rank != 0:
            return
        self.materializations.append({"metadata": metadata, "data_version": data_version})
        self._emit({"event": "materialize", "metadata": metadata, "data_version": data_version})

    def progress(self, total: int, unit: str = "items", every_s: float = 5.0, start: int = 0) -> Progress:
        if self.bars and self.rank == 0:
            return BarProgress(self, total, unit, every_s, start)
        return Progress(self, total, unit, every_s, start)


def _pipes_metadata_value(v: Any) -> Any:
    """Pipes metadata wants JSON scalars, lists or dicts; numpy scalars and paths are converted."""
    if hasattr(v, "item") and not isinstance(v, (list, dict)):
        return v.item()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_pipes_metadata_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _pipes_metadata_value(x) for k, x in v.items()}
    return str(v)


def pipes_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """Pipes takes raw scalars and lists, but a dict value must be ``{raw_value, type}``: nested
    dicts travel as the ``json`` type."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        v = _pipes_metadata_value(value)
        out[str(key)] = {"raw_value": v, "type": "json"} if isinstance(v, dict) else v
    return out


def log_to(logger: Any, message: str, level: str = "info") -> None:
    """``message`` on a Dagster logger (``context.log``, ``pipes.log``) at ``level``; levels other
    than debug / info / warning / error log as info."""
    getattr(logger, level if level in ("debug", "info", "warning", "error") else "info")(message)


class PipesReporter:
    """Rank-0 reporter over an open Dagster Pipes context."""

    def __init__(self, pipes: Any):
        self.pipes = pipes
        self.rank = 0
        self.extras = dict(pipes.extras)
        self.retry_number = int(pipes.retry_number)

    def log(self, message: str, level: str = "info") -> None:
        log_to(self.pipes.log, message, level)

    def metrics(self, step: int | None = None, **values: float) -> None:
        # at debug: one line per logged step is the run's event log and the run folder's
        # metrics.jsonl / TensorBoard, not the terminal (the console shows info and up)
        payload = {"step": step, **{k: _pipes_metadata_value(v) for k, v in values.items()}}
        self.pipes.log.debug(json.dumps(payload, default=_json_default))

    def materialize(self, metadata: dict[str, Any], data_version: str | None = None) -> None:
        self.pipes.report_asset_materialization(metadata=pipes_metadata(metadata), data_version=data_version)

    def progress(self, total: int, unit: str = "items", every_s: float = 5.0, start: int = 0) -> Progress:
        return Progress(self, total, unit, every_s, start)


def launched_by_dagster() -> bool:
    """True when a Dagster Pipes client started this process (its bootstrap env var is set)."""
    try:
        from dagster_pipes import PipesEnvVarParamsLoader
    except ImportError:  # dagster-pipes is a dependency; standalone installs may lack it
        return False
    return PipesEnvVarParamsLoader().is_dagster_pipes_process()


@contextlib.contextmanager
def open_reporter(bars: bool = False) -> Iterator[Reporter]:
    """Pipes on global rank 0 when launched by Dagster, a stdout/stderr reporter otherwise
    (``bars``: with tqdm progress bars)."""
    if global_rank() == 0 and launched_by_dagster():
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            yield PipesReporter(pipes)
    else:
        yield StdoutReporter(bars=bars)
