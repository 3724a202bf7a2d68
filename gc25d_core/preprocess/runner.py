"""Sharded, resumable per-clip processing shared by the preprocessing jobs.

Each rank takes a deterministic shard of the clips (sorted by clip_id, round-robin by global rank),
first removes the temp files that killed writers left in the task's output folders, skips clips
whose outputs already exist and validate, builds the rest and writes them atomically.
A failed clip is recorded with its error and the loop goes on; at the end the ranks gather their
results, rank 0 reports one materialization, and the job fails if any clip failed (so a retry redoes
only those). Failures are also written to ``<run_dir>/failures/rank-<r>.json``.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gc25d_core.atomic import atomic_write_text, sweep_stale_tmp
from gc25d_core.distributed import dist_active, global_rank, shard, world_size
from gc25d_core.faults import maybe_inject_fault
from gc25d_core.index import ClipRow
from gc25d_core.job_record import keep_finished_job
from gc25d_core.report import Reporter, human_bytes


@dataclass
class ClipFailure:
    clip_id: str
    error: str
    traceback: str


@dataclass
class ShardResult:
    rank: int
    num_assigned: int = 0
    num_done: int = 0
    num_skipped: int = 0
    bytes_written: int = 0
    bytes_on_disk: int = 0  # every output of this rank's clips, built now or before
    seconds: float = 0.0
    failures: list[ClipFailure] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class ClipFailuresError(RuntimeError):
    """Some clips failed; the message lists which and why."""


OnClip = Callable[[ClipRow, int], None]


class OnError(Protocol):
    """``on_error(row, message)``; the runner's also takes the traceback."""

    def __call__(self, row: ClipRow, error: str, tb: str = "") -> None: ...


BuildMany = Callable[[list[ClipRow], OnClip, OnError], dict[str, Any]]


@dataclass(frozen=True)
class ClipTask:
    """What one job does per clip.

    ``outputs(row)`` lists the files the clip produces; ``is_done(row)`` says whether they exist and
    validate (cheap checks preferred); ``build(row)`` computes and writes them atomically and returns
    the bytes written. A task that pipelines its clips (the GPU latents job) sets ``build_many``
    instead: it gets this rank's pending rows and calls ``on_clip(row, nbytes)`` / ``on_error(row, msg)``.
    """

    name: str
    outputs: Callable[[ClipRow], list[Path]]
    is_done: Callable[[ClipRow], bool]
    build: Callable[[ClipRow], int] | None = None
    build_many: BuildMany | None = None
    # files every clip's outputs depend on besides the index and the config (the VAE's weights)
    inputs: Sequence[Path] = ()


def shard_rows(rows: Sequence[ClipRow], rank: int | None = None, world: int | None = None) -> list[ClipRow]:
    return shard(sorted(rows, key=lambda r: r.clip_id), rank, world)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def _one_by_one(build: Callable[[ClipRow], int]) -> BuildMany:
    """``build`` as a ``build_many``: one clip at a time, a clip that raises is reported and skipped."""

    def build_many(rows: list[ClipRow], on_clip: OnClip, on_error: OnError) -> dict[str, Any]:
        for row in rows:
            try:
                nbytes = build(row)
            except Exception as e:  # record and continue: one bad clip must not hide the others
                on_error(row, _error(e), traceback.format_exc())
                continue
            on_clip(row, nbytes)
        return {}

    return build_many


def sweep_output_folders(task: ClipTask, rows: Sequence[ClipRow]) -> list[Path]:
    """Remove the temp files of dead writers where ``task`` writes; live writers' files stay (so
    every rank may sweep while the others already write)."""
    folders = {path.parent for row in rows for path in task.outputs(row)}
    return [p for folder in sorted(folders) for p in sweep_stale_tmp(folder)]


class RankCounts:
    """The job's clips done, not rank 0's share: each rank rewrites its count in
    ``<folder>/rank-<r>.json`` (atomically, at most once a second, and at its end) and rank 0 adds
    the others' to its own. The run folder is shared by every node of a job."""

    def __init__(self, folder: Path, rank: int, world: int, every_s: float = 1.0):
        self.folder, self.rank, self.world, self.every_s = folder, rank, world, every_s
        self._last = -math.inf
        folder.mkdir(parents=True, exist_ok=True)
        self.write(0)

    def write(self, done: int) -> None:
        atomic_write_text(self.folder / f"rank-{self.rank}.json", json.dumps({"done": done}))
        self._last = time.monotonic()

    def others(self) -> int:
        total = 0
        for r in range(self.world):
            if r == self.rank:
                continue
            # a rank that has not written yet counts 0
            with contextlib.suppress(OSError, ValueError, KeyError):
                total += int(json.loads((self.folder / f"rank-{r}.json").read_text())["done"])
        return total

    def __call__(self, done: int, final: bool = False) -> int:
        if final or time.monotonic() - self._last >= self.every_s:
            self.write(done)
        return done + self.others() if self.rank == 0 else done


def run_shard(task: ClipTask, rows: Sequence[ClipRow], rep: Reporter, run_dir: Path) -> ShardResult:
    rank = global_rank()
    swept = sweep_output_folders(task, rows)
    if swept:
        rep.log(f"{task.name}: removed {len(swept)} temp file(s) of killed writers")
    mine = shard_rows(rows)
    result = ShardResult(rank=rank, num_assigned=len(mine))
    t0 = time.monotonic()
    world = world_size()

    def fail(row: ClipRow, error: str, tb: str = "") -> None:
        result.failures.append(ClipFailure(row.clip_id, error, tb))
        rep.log(f"{task.name}: clip {row.clip_id} failed: {error}", level="error")

    pending = []
    for row in mine:
        try:
            finished = task.is_done(row)
        except Exception as e:  # a check that cannot run is a failure of that clip, not of the job
            fail(row, _error(e), traceback.format_exc())
            continue
        if finished:
            result.num_skipped += 1
        else:
            pending.append(row)
    # what the whole job skips and builds, said once by rank 0; the progress counts built clips only
    shares = gather_objects((len(pending), result.num_skipped))
    num_pending, skipped = sum(p for p, _ in shares), sum(k for _, k in shares)
    if rank == 0:
        rep.log(
            f"{task.name}: {skipped} of {len(rows)} clips already built (skipped), {num_pending} to build"
            + (f" over {world} ranks" if world > 1 else "")
        )
    progress = rep.progress(total=num_pending if rank == 0 else len(pending), unit="clips")
    counts = RankCounts(run_dir / "progress", rank, world)
    if world > 1 and rank == 0:
        progress.job_done, progress.label = counts, f"over {world} ranks"

    def failed(row: ClipRow, error: str, tb: str = "") -> None:
        fail(row, error, tb)
        progress.update(1)

    def done(row: ClipRow, nbytes: int) -> None:
        result.bytes_written += nbytes
        result.num_done += 1
        maybe_inject_fault(result.num_done + result.num_skipped + 1, rep.retry_number)  # test hook
        progress.update(1)

    if pending:
        maybe_inject_fault(result.num_skipped + 1, rep.retry_number)  # test hook: GC25D_FAULT step = clip #
    build_many = task.build_many
    if build_many is None:
        assert task.build is not None, f"task {task.name} has neither build nor build_many"
        build_many = _one_by_one(task.build)
    result.extra = build_many(pending, done, failed)
    counts(progress.done, final=True)
    result.seconds = time.monotonic() - t0
    result.bytes_on_disk = sum(p.stat().st_size for row in mine for p in task.outputs(row) if p.is_file())
    path = run_dir / "failures" / f"rank-{rank}.json"
    atomic_write_text(path, json.dumps([asdict(f) for f in result.failures], indent=1))
    return result


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (a collective: every rank calls it)."""
    import torch.distributed as dist

    if not dist_active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_results(result: ShardResult) -> list[ShardResult]:
    return gather_objects(result)


def summarize(task: ClipTask, results: list[ShardResult], num_rows: int) -> dict[str, Any]:
    """What the job did and what the data is. A run that built nothing (every clip was there)
    says so and reports no rate or time: those would describe the check, not the data."""
    failures = [f for r in results for f in r.failures]
    seconds = max((r.seconds for r in results), default=0.0)
    done = sum(r.num_done for r in results)
    skipped = sum(r.num_skipped for r in results)
    out: dict[str, Any] = {
        "task": task.name,
        "status": "built"
        if done
        else ("skipped: every clip was built before" if skipped else "nothing to do"),
        "num_clips": num_rows,
        "num_built": done,
        "num_skipped": skipped,
        "num_failed": len(failures),
        "size": human_bytes(sum(r.bytes_on_disk for r in results)),
        "world_size": len(results),
    }
    if done:
        out["written"] = human_bytes(sum(r.bytes_written for r in results))
        out["seconds"] = round(seconds, 3)
        out["clips_per_s"] = round(done / seconds, 4) if seconds > 0 else None
        out.update({k: round(sum(float(r.extra.get(k, 0.0)) for r in results), 3) for k in results[0].extra})
    if failures:
        out["failures"] = [{"clip_id": f.clip_id, "error": f.error} for f in failures[:50]]
    return out


def closing_line(task: ClipTask, summary: dict[str, Any]) -> str:
    if not summary["num_built"]:
        return f"{task.name}: {summary['status']} ({summary['num_skipped']} clips, {summary['size']})"
    return (
        f"{task.name}: built {summary['num_built']} clips ({summary['written']}) in {summary['seconds']:.1f} s "
        f"over {summary['world_size']} ranks; {summary['num_skipped']} skipped; data {summary['size']}"
    )


def run_task(
    task: ClipTask,
    rows: Sequence[ClipRow],
    rep: Reporter,
    run_dir: Path,
    extra_metadata: dict[str, Any] | None = None,
    index: Path | None = None,
) -> dict[str, Any]:
    """Run this rank's shard, gather, report once from rank 0, fail if any clip failed. With
    ``index`` (the clips index ``rows`` come from, all of them) rank 0 keeps a record of the
    finished job (``job_record``): a rerun finds it and launches nothing."""
    result = run_shard(task, rows, rep, run_dir)
    summary = summarize(task, gather_results(result), len(rows))
    if summary["num_failed"]:
        lines = "\n".join(f"  {f['clip_id']}: {f['error']}" for f in summary["failures"])
        raise ClipFailuresError(f"{task.name}: {summary['num_failed']} of {len(rows)} clips failed:\n{lines}")
    if rep.rank == 0:  # the job's closing line, said once
        rep.log(closing_line(task, summary))
        if index is not None:
            keep_finished_job(
                run_dir, [index, *task.inputs], [p for r in rows for p in task.outputs(r)], summary
            )
    rep.materialize({**summary, **(extra_metadata or {})})
    return summary
