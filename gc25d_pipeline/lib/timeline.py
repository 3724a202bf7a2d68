"""Where a command's wall time went, from the Dagster instance's own records: the runs created
since a moment (``make run`` passes its start) and each run's steps, by their start, with their
seconds. ``make run`` prints it last, so the figure a user sees names its parts."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import dagster as dg


def clock(seconds: float) -> str:
    """75.44 → "1:15.4" (minutes:seconds to a tenth)."""
    tenths = round(seconds * 10)
    return f"{tenths // 600}:{tenths % 600 / 10:04.1f}"


def _run_name(run: dg.DagsterRun) -> str:
    # `dg launch --assets` runs an ad-hoc job named __ASSET_JOB: name it by what it selected
    name = "assets" if run.job_name.startswith("__") else run.job_name
    partition = run.tags.get("dagster/partition")
    return f"{name} [{partition}]" if partition else name


def timeline(instance: dg.DagsterInstance, since: float, now: float | None = None) -> str:
    """The runs created at or after ``since`` (a Unix time), oldest first, each with its status,
    wall time and steps; headed by the wall time from ``since`` to ``now``."""
    now = time.time() if now is None else now
    after = datetime.fromtimestamp(since, tz=UTC)
    runs = instance.get_runs(filters=dg.RunsFilter(created_after=after))
    stats = {r.run_id: instance.get_run_stats(r.run_id) for r in runs}
    # a run not started yet (queued) counts from now: last, with no time
    began = {k: st.start_time or st.launch_time or now for k, st in stats.items()}
    runs = sorted(runs, key=lambda r: began[r.run_id])
    started = after.strftime("%H:%M:%S UTC")
    lines = [f"timeline since {started}: {clock(now - since)} of wall time, {len(runs)} runs"]
    width, in_runs = 34, 0.0
    for run in runs:
        wall = (stats[run.run_id].end_time or now) - began[run.run_id]
        in_runs += wall
        lines.append(f"  {_run_name(run):<{width}} {clock(wall):>7}  {run.status.value}")
        steps = sorted(instance.get_run_step_stats(run.run_id), key=lambda s: s.start_time or 0.0)
        for step in steps:
            if step.start_time is None:
                continue
            seconds = (step.end_time or now) - step.start_time
            status = "" if step.status is None or step.status.value == "SUCCESS" else f"  {step.status.value}"
            lines.append(f"    {step.step_key:<{width - 2}} {clock(seconds):>7}{status}")
    # the commands around the runs: their processes' start, the CLI's own steps
    lines.append(f"  {'outside the runs':<{width}} {clock(max(0.0, now - since - in_runs)):>7}")
    return "\n".join(lines)
