"""The live sweeps over the ranks of the eval job: every (export, sweep, rollout) to compute is one
task; the tasks go to the ranks longest first, each to the rank with the least work so far (a
60 s rollout weighs 240 cells, the action probe's 39), so that two ranks finish together.

The truth of a sweep is drawn once per job, its frames shared among the ranks (each ray-casts the
frames f ≡ rank mod world into one memory-mapped file of the run folder); the VAE encodes it on the
ranks that score an own rollout. A rank loads an export once and plays its tasks of it in turn
(``LiveSession.start`` resets the world, the cache and the noise). Rank 0 gathers the scored
rollouts (per-frame numbers, a few frames) and assembles each (export, sweep) row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import barrier, dist_active, global_rank, world_size
from gc25d_core.eval import live as L
from gc25d_core.eval.live_score import FRAME_METRICS, assemble_live, score_rollout
from gc25d_core.eval.spec import EvalExport

Task = tuple[str, str, tuple[str, ...]]  # (export label, sweep, rollout kinds played as one task)
# the own and the other session have one length: played by one session, decoded as one batch
TASK_KINDS: tuple[tuple[str, ...], ...] = (("own", "other"), ("changed",))


def shard(tasks: Sequence[Task], cost: Callable[[Task], int], world: int) -> list[list[Task]]:
    """Longest first, each to the least loaded rank (ties: the lower rank); deterministic."""
    loads = [0] * world
    out: list[list[Task]] = [[] for _ in range(world)]
    for t in sorted(tasks, key=lambda t: (-cost(t), t)):
        r = min(range(world), key=lambda i: (loads[i], i))
        out[r].append(t)
        loads[r] += cost(t)
    return out


def scripts(sweep: L.LiveSweep) -> dict[str, list[np.ndarray]]:
    own = L.session_script(sweep.script_seed, sweep.cells)
    changed = L.changed_script(own, sweep.change_cell)[: sweep.rollout_cells("changed")]
    return {"own": own, "other": L.session_script(sweep.script_seed + 1, sweep.cells), "changed": changed}


def shared_truth(backend: L.LiveBackend, blocks: list[np.ndarray], path: Path) -> L.Truth:
    """The truth's frames drawn by all ranks into ``path`` (a .npy memory map), read by all."""
    from numpy.lib.format import open_memmap

    rank, world = global_rank(), world_size()
    states = backend.states(blocks[:0])
    shape = (1 + 4 * len(blocks), *backend.rgb_frames(states, 1)[0].shape)
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        open_memmap(path, mode="w+", dtype=np.uint8, shape=shape).flush()
    barrier()
    out = open_memmap(path, mode="r+")
    truth = L.render_truth(
        backend,
        blocks,
        workers=L.truth_workers(shape[0], world),
        frames_out=out,
        rank=rank,
        world_size=world,
    )
    out.flush()
    barrier()
    truth.frames = np.load(path, mmap_mode="r")
    return truth


def run_live(
    cfg: Gc25dConfig,
    backend: L.LiveBackend,
    vae: Any,
    pending: Sequence[tuple[EvalExport, L.LiveSweep]],
    run_dir: Path,
    cap: float,
    log: Callable[[str], None],
    keep: Callable[[tuple[str, str], dict[str, Any]], None] | None = None,
) -> dict[tuple[str, str], dict[str, Any]] | None:
    """The rows of ``pending`` (export, sweep) on rank 0 ({"sampler", "sweep", "strip"}), else None.
    Each row goes to ``keep`` once, as soon as it exists: on a single rank when its rollouts are
    scored, so that a job stopped part way (a device call's end) keeps the rows it finished; with
    several ranks on rank 0 once it has gathered every rank's rollouts."""
    rank, world = global_rank(), world_size()
    sweeps = {s.name: s for _, s in pending}
    exports = {e.label: e for e, _ in pending}
    plays = {name: scripts(s) for name, s in sweeps.items()}
    truths = {}
    for name in sorted(sweeps):
        t0 = time.perf_counter()
        truths[name] = shared_truth(backend, plays[name]["own"], run_dir / "live" / f"{name}_truth.npy")
        log(
            f"{name}: the truth's {len(truths[name].frames)} frames drawn in {time.perf_counter() - t0:.1f} s"
        )
    assert sorted(k for kinds in TASK_KINDS for k in kinds) == sorted(L.KINDS)
    tasks = [(e.label, s.name, kinds) for e, s in pending for kinds in TASK_KINDS]
    mine = shard(tasks, lambda t: sum(sweeps[t[1]].rollout_cells(k) for k in t[2]), world)[rank]
    metrics = {n: m for n, f in FRAME_METRICS.items() if (m := f(cfg)) is not None}
    latents: dict[str, Any] = {}  # per sweep, for every export this rank plays: the truth's encode
    changed_truths: dict[str, np.ndarray] = {}  # and the changed script's truth
    done: dict[tuple[str, str, str], dict[str, Any]] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # single rank: each row as it is finished
    session, loaded = None, None
    for label, name, kinds in sorted(mine):  # by export: each loaded once on this rank
        if loaded != label:
            t0 = time.perf_counter()
            session, loaded = backend.session(exports[label].path, exports[label].sha256), label
            log(f"{label}: session loaded and warmed up in {time.perf_counter() - t0:.1f} s")
        sweep, truth = sweeps[name], truths[name]
        t0 = time.perf_counter()
        played_rows = L.play_rows(session, [plays[name][kind] for kind in kinds])
        cells = sum(len(plays[name][kind]) for kind in kinds)
        played_s = time.perf_counter() - t0
        log(
            f"{label} {name} {'+'.join(kinds)}: {cells} cells played and decoded in {played_s:.1f} s "
            f"({1000 * played_s / cells:.0f} ms a cell)"
        )
        for kind, played in zip(kinds, played_rows, strict=True):
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if kind == "own":
                if name not in latents:
                    latents[name] = L.truth_latents(vae, np.array(truth.frames))  # a writable copy
                extra["truth_latent"] = latents[name]
                extra["frame_metrics"] = metrics
            if kind == "changed":
                if name not in changed_truths:
                    changed_truths[name] = L.render_truth(backend, plays[name]["changed"]).frames
                extra["changed_truth"] = changed_truths[name]
            done[label, name, kind] = score_rollout(sweep, kind, played, truth, cap=cap, **extra)
            psnr = np.mean(done[label, name, kind]["psnr"])
            log(
                f"{label} {name} {kind}: {len(plays[name][kind])} cells, PSNR vs truth {psnr:.2f} dB "
                f"(scored in {time.perf_counter() - t0:.1f} s)"
            )
        if world == 1 and all((label, name, k) in done for k in L.KINDS):
            rows[label, name] = live_row(sweep, {k: done[label, name, k] for k in L.KINDS}, truth)
            if keep is not None:
                keep((label, name), rows[label, name])
    parts: list[Any] | None = [done]
    if dist_active():
        import torch.distributed as dist

        parts = [None] * world if rank == 0 else None
        dist.gather_object(done, parts, dst=0)
    if parts is None:
        return None
    every: dict[tuple[str, str, str], dict[str, Any]] = {}
    for part in parts:
        every.update(part)
    for e, s in pending:
        if (e.label, s.name) not in rows:
            rows[e.label, s.name] = live_row(
                s, {k: every[e.label, s.name, k] for k in L.KINDS}, truths[s.name]
            )
            if keep is not None:
                keep((e.label, s.name), rows[e.label, s.name])
    return rows


def live_row(sweep: L.LiveSweep, rolls: dict[str, dict[str, Any]], truth: L.Truth) -> dict[str, Any]:
    """An (export, sweep) row from its scored rollouts (one per kind)."""
    return {
        "sampler": {"kind": "causal", "sampler": "deploy.session"},
        "sweep": assemble_live(sweep, rolls, truth),
        "strip": strip_png(rolls["own"]["strip"]),
    }


def strip_png(strip: dict[str, np.ndarray], max_width: int = 1400) -> bytes:
    """Rows truth | generated | ids at the session's picked frames."""
    import cv2

    from gc25d_core.preview import colorize_ids, png_bytes

    rows = [
        np.concatenate(list(strip["truth"]), axis=1),
        np.concatenate(list(strip["frames"]), axis=1),
        np.concatenate([colorize_ids(i) for i in strip["ids"]], axis=1),
    ]
    sheet = np.concatenate(rows, axis=0)
    if sheet.shape[1] > max_width:
        s = max_width / sheet.shape[1]
        sheet = cv2.resize(sheet, (max_width, max(1, int(sheet.shape[0] * s))), interpolation=cv2.INTER_AREA)
    return png_bytes(sheet)
