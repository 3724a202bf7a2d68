"""The live sweeps over the ranks of the eval job: every (export, sweep, rollout) to compute is one
task; the tasks go to the ranks longest first, each to the rank with the least work so far (a
60 s rollout weighs 240 cells, the action probe's 39), so that two ranks finish together.

The truth of a sweep is drawn once per job, its frames shared among the ranks (each ray-casts the
frames f ≡ rank mod world into one memory-mapped file of the run folder; a long session's in a
process pool beside the sessions, see ``Truths``); a rank that needs the truth waits until every
rank has drawn its share, not until every rank asks for it. The VAE encodes it once, on the
least loaded rank that scores an own rollout, for the others (``Truths.share_encodes``; on a long
truth drawn beside the sessions each such rank encodes it). Where the sessions replay kept cells of
ids (a CPU's numpy renderer, ``jobs.eval_live.KeptCellsWorld``), the own and the other session's
cells are drawn once per job too, each by one rank before the sessions (``Truths.keep_cells``):
every export plays both, and otherwise each rank's first export drew them all again. A rank loads
an export once and plays its tasks of it in turn (``LiveSession.start`` resets the world, the
cache and the noise). Rank 0 gathers the scored rollouts (per-frame numbers, a few frames) and
assembles each (export, sweep) row.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.atomic import atomic_write_bytes
from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import barrier, dist_active, global_rank, world_size
from gc25d_core.eval import live as L
from gc25d_core.eval.live_score import FRAME_METRICS, assemble_live, score_rollout
from gc25d_core.eval.spec import EvalExport

Task = tuple[str, str, tuple[str, ...]]  # (export label, sweep, rollout kinds played as one task)
# the sessions every export plays whole: their cells of ids drawn once per job (``Truths``)
SHARED_CELLS = ("other", "own")
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


def write_npy(path: Path, array: np.ndarray) -> None:
    """``array`` as a .npy file another rank reads: written whole or not at all."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


class Truths:
    """The truths of the sweeps (each sweep's own script, and its changed script for a rank that
    plays it), drawn by all ranks into one memory map per sweep in the run folder (each rank the
    frames f ≡ rank mod world). Where the drawing takes a process pool (a long session) it runs
    beside the sessions: a thread feeds the pool while this rank loads and plays its exports, and
    ``get`` waits for it only when the first rollout is scored (a ten-minute session's truth is
    minutes of ray casts on the CPU, its first rollout as long on the GPU).

    A rank that has drawn its share says so with a file of its own in the run folder (written after
    its frames are flushed), and ``get`` waits for those files rather than meeting the other ranks
    in a barrier: a barrier would hold a rank whose first rollout is short until the others have
    played their first, long one.

    Where the sessions replay kept cells and the truth is drawn before them, the ranks also share
    the own and the other session's cells of ids: each is drawn by one rank first, written whole,
    and read by another rank when it is about to play it (``keep_cells``)."""

    WAIT_S = 1800.0  # as long as the process group's own timeout

    def __init__(
        self,
        backend: L.LiveBackend,
        plays: dict[str, dict[str, list[np.ndarray]]],
        changed_for: set[str],
        run_dir: Path,
        log: Callable[[str], None],
    ):
        from numpy.lib.format import open_memmap

        self.rank, self.world = global_rank(), world_size()
        self.backend, self.plays, self.log = backend, plays, log
        self.paths = {n: run_dir / "live" / f"{n}_truth.npy" for n in sorted(plays)}
        self.latent_paths = {n: run_dir / "live" / f"{n}_truth_latent.npy" for n in sorted(plays)}
        self.drawn_marks = [run_dir / "live" / f"truth_drawn.rank{r}" for r in range(self.world)]
        frame_shape = backend.rgb_frames(backend.states([]), 1)[0].shape
        shapes = {n: (1 + 4 * len(plays[n]["own"]), *frame_shape) for n in self.paths}
        self.workers = {n: L.truth_workers(shapes[n][0], self.world) for n in self.paths}
        beside = any(w > 1 for w in self.workers.values())
        # (sweep, kind) -> the file of that session's cells of ids, drawn by one rank for all
        self.cell_paths: dict[tuple[str, str], Path] = {}
        if self.world > 1 and backend.keeps_cells and not beside:
            self.cell_paths = {
                (n, kind): run_dir / "live" / f"{n}_{kind}_ids.npy"
                for n in sorted(plays)
                for kind in SHARED_CELLS
            }
        self._kept: set[tuple[str, str]] = set()
        if self.rank == 0:
            for n, path in self.paths.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                open_memmap(path, mode="w+", dtype=np.uint8, shape=shapes[n]).flush()
            # an earlier job's, in a run folder used again
            for mark in [*self.drawn_marks, *self.latent_paths.values(), *self.cell_paths.values()]:
                mark.unlink(missing_ok=True)
        barrier()  # the files exist and no rank's mark is an earlier job's
        self._out = {n: open_memmap(path, mode="r+") for n, path in self.paths.items()}
        self._changed_for = changed_for
        self._drawn: dict[str, L.Truth] = {}
        self.changed: dict[str, np.ndarray] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._done: dict[str, L.Truth] | None = None
        self._latents: dict[str, Any] = {}
        self.encoder: dict[str, int] = {}  # sweep -> the rank that encodes its truth for the others
        if beside:
            self._thread = threading.Thread(target=self._draw_guarded, name="live-truth", daemon=True)
            self._thread.start()
        else:  # one process: drawn here, before the sessions (a thread would share the GIL with them)
            self._draw()

    def _draw_guarded(self) -> None:
        try:
            self._draw()
        except BaseException as e:  # raised again where the truth is asked for
            self._error = e

    def _draw(self) -> None:
        self._draw_cells()
        for name, out in self._out.items():
            t0 = time.perf_counter()
            workers = self.workers[name]
            self._drawn[name] = L.render_truth(
                self.backend,
                self.plays[name]["own"],
                workers=workers,
                frames_out=out,
                rank=self.rank,
                world_size=self.world,
            )
            out.flush()
            if name in self._changed_for:
                self.changed[name] = L.render_truth(
                    self.backend, self.plays[name]["changed"], workers=workers
                ).frames
            where = " beside the sessions" if self._thread is not None else ""
            self.log(
                f"{name}: the truth's {len(out)} frames drawn in {time.perf_counter() - t0:.1f} s{where} "
                f"({workers} process{'es' if workers > 1 else ''})"
            )
        self.drawn_marks[self.rank].touch()

    def _draw_cells(self) -> None:
        """This rank's share of the sessions' cells (the n-th of ``cell_paths`` on rank n % world),
        each written whole for the other ranks and kept for this rank's sessions."""
        for i, (name, kind) in enumerate(sorted(self.cell_paths)):
            if i % self.world != self.rank:
                continue
            t0 = time.perf_counter()
            blocks = self.plays[name][kind]
            ids = self.backend.draw_cells(blocks)
            write_npy(self.cell_paths[name, kind], ids)
            self.backend.keep_cells(blocks, ids)
            self._kept.add((name, kind))
            self.log(
                f"{name}: the {kind} session's {len(blocks)} cells of ids drawn for every rank in "
                f"{time.perf_counter() - t0:.1f} s"
            )

    def keep_cells(self, name: str, kinds: Sequence[str]) -> None:
        """Before this rank plays ``kinds`` of sweep ``name``: the shared cells they replay (the
        action probe's first cells are the own session's), read from the rank that drew them."""
        need = {k for k in kinds if k in SHARED_CELLS} | ({"own"} if "changed" in kinds else set())
        for kind in sorted(need):
            if (name, kind) in self._kept or (name, kind) not in self.cell_paths:
                continue
            path = self.cell_paths[name, kind]
            waited = self._await([path], f"the {kind} session's cells")
            self.backend.keep_cells(self.plays[name][kind], np.load(path, allow_pickle=False))
            self._kept.add((name, kind))
            if waited > 1.0:
                self.log(f"waited {waited:.1f} s for the {kind} session's cells of {name}")

    def _await(self, paths: Sequence[Path], what: str) -> float:
        """Seconds until every one of ``paths`` exists (another rank's file: no collective)."""
        t0 = time.perf_counter()
        while not all(p.exists() for p in paths):
            if time.perf_counter() - t0 > self.WAIT_S:
                missing = [p.name for p in paths if not p.exists()]
                raise TimeoutError(f"{what}: no {missing} after {self.WAIT_S:.0f} s")
            time.sleep(0.05)
        return time.perf_counter() - t0

    def _wait_for_ranks(self) -> None:
        waited = self._await(self.drawn_marks, "the live truth")
        if waited > 1.0:
            self.log(f"waited {waited:.1f} s for the other ranks' truth frames")

    def share_encodes(self, vae: Any, plan: Sequence[Sequence[Task]], cost: Callable[[Task], int]) -> None:
        """With several ranks and the truth drawn before the sessions: each sweep's truth is encoded
        once, before its sessions, by the least loaded rank of those that score an own rollout of
        it, and the others read that rank's file when they first score (on a CPU the encode of a
        minute's truth is a quarter of a rank's live work; done once, off the busiest rank's path).
        Otherwise (one rank, or a long truth drawn beside the sessions) each rank encodes when it
        first scores. A collective-free agreement: every rank computes the same plan."""
        if self.world == 1 or self._thread is not None:
            return
        loads = [sum(cost(t) for t in tasks) for tasks in plan]
        for name in self.paths:
            ranks = [r for r in range(self.world) if any(t[1] == name and "own" in t[2] for t in plan[r])]
            if ranks:
                self.encoder[name] = min(ranks, key=lambda r: (loads[r], r))
        for name, r in self.encoder.items():
            if r == self.rank:
                write_npy(self.latent_paths[name], self.latent(name, vae).numpy())

    def latent(self, name: str, vae: Any) -> Any:
        """The VAE's encode of sweep ``name``'s truth, [48, N + 1, H, W] on the CPU (``truth_latents``):
        this rank's own, or the encoding rank's file (``share_encodes``)."""
        if name not in self._latents:
            t0 = time.perf_counter()
            src = self.encoder.get(name, self.rank)
            if src == self.rank:
                self._latents[name] = L.truth_latents(vae, np.array(self.get()[name].frames))  # writable
                self.log(f"{name}: the truth's VAE encode in {time.perf_counter() - t0:.1f} s")
            else:
                path = self.latent_paths[name]
                self._await([path], "the live truth's encode")
                self._latents[name] = torch.from_numpy(np.load(path, allow_pickle=False))
                self.log(
                    f"{name}: the truth's VAE encode read from rank {src} in {time.perf_counter() - t0:.1f} s"
                )
        return self._latents[name]

    def get(self) -> dict[str, L.Truth]:
        """Every sweep's truth once all ranks have drawn their frames (no collective: a rank
        calls it when it first scores, and before the gather)."""
        if self._done is None:
            if self._thread is not None:
                t0 = time.perf_counter()
                self._thread.join()
                if time.perf_counter() - t0 > 1.0:
                    self.log(f"waited {time.perf_counter() - t0:.1f} s for the truth")
            if self._error is not None:
                raise self._error
            self._wait_for_ranks()
            for name, truth in self._drawn.items():
                truth.frames = np.load(self.paths[name], mmap_mode="r")
            self._done = self._drawn
        return self._done


def run_live(
    cfg: Gc25dConfig,
    backend: L.LiveBackend,
    vae: Any,
    pending: Sequence[tuple[EvalExport, L.LiveSweep]],
    run_dir: Path,
    cap: float,
    log: Callable[[str], None],
    keep: Callable[[tuple[str, str], dict[str, Any]], None] | None = None,
    ceiling: bool = False,
) -> dict[tuple[str, str], dict[str, Any]] | None:
    """The rows of ``pending`` (export, sweep) on rank 0 ({"sampler", "sweep", "strip"}), else None.
    Each row goes to ``keep`` once, as soon as it exists: on a single rank when its rollouts are
    scored, so that a job stopped part way (a device call's end) keeps the rows it finished; with
    several ranks on rank 0 once it has gathered every rank's rollouts. ``ceiling``: each own
    rollout's row also scores the truth through the VAE (``EvalConfig.live_ceiling``)."""
    rank, world = global_rank(), world_size()
    sweeps = {s.name: s for _, s in pending}
    exports = {e.label: e for e, _ in pending}
    plays = {name: scripts(s) for name, s in sweeps.items()}
    assert sorted(k for kinds in TASK_KINDS for k in kinds) == sorted(L.KINDS)
    tasks = [(e.label, s.name, kinds) for e, s in pending for kinds in TASK_KINDS]

    def cost(t: Task) -> int:
        return sum(sweeps[t[1]].rollout_cells(k) for k in t[2])

    plan = shard(tasks, cost, world)
    mine = plan[rank]
    truth_of = Truths(backend, plays, {name for _, name, kinds in mine if "changed" in kinds}, run_dir, log)
    truth_of.share_encodes(vae, plan, cost)
    metrics = {n: m for n, f in FRAME_METRICS.items() if (m := f(cfg)) is not None}
    ceilings: dict[str, list[float]] = {}  # per sweep: the PSNR per frame of that encode decoded
    done: dict[tuple[str, str, str], dict[str, Any]] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # single rank: each row as it is finished
    session, loaded = None, None
    for label, name, kinds in sorted(mine):  # by export: each loaded once on this rank
        if loaded != label:
            t0 = time.perf_counter()
            session, loaded = backend.session(exports[label].path, exports[label].sha256), label
            log(f"{label}: session loaded and warmed up in {time.perf_counter() - t0:.1f} s")
        sweep = sweeps[name]
        truth_of.keep_cells(name, kinds)
        t0 = time.perf_counter()
        split: dict[str, float] = {}
        played_rows = L.play_rows(session, [plays[name][kind] for kind in kinds], split)
        cells = sum(len(plays[name][kind]) for kind in kinds)
        played_s = time.perf_counter() - t0
        log(
            f"{label} {name} {'+'.join(kinds)}: {cells} cells played and decoded in {played_s:.1f} s "
            f"({1000 * played_s / cells:.0f} ms a cell: {1000 * split['play_s'] / cells:.0f} ms the "
            f"session's steps, {1000 * split['decode_s'] / cells:.0f} ms the batched decode)"
        )
        truth = truth_of.get()[name]
        for kind, played in zip(kinds, played_rows, strict=True):
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if kind == "own":
                extra["truth_latent"] = truth_of.latent(name, vae)
                if ceiling:
                    if name not in ceilings:
                        t1 = time.perf_counter()
                        ceilings[name] = L.ceiling_psnr(session, extra["truth_latent"], truth.frames, cap)
                        log(
                            f"{name}: the truth through the VAE decoded and scored in "
                            f"{time.perf_counter() - t1:.1f} s"
                        )
                    extra["ceiling_psnr"] = ceilings[name]
                extra["frame_metrics"] = metrics
            if kind == "changed":
                extra["changed_truth"] = truth_of.changed[name]
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
    truths = truth_of.get()  # a rank with nothing to play still draws its share
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
