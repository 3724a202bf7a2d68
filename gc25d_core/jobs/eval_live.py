"""The deploy package's live session and code world as the eval's live sweeps play them
(``gc25d_core.eval.live.LiveBackend``): eval and deploy are peers that never import one another, so
the job layer joins them.

The session is ``deploy.session.LiveSession`` on ``DeployRuntime.load`` (seed 0, the exact path,
replayed as CUDA graphs on a GPU; the job's VAE and text table) and ``deploy.world.LiveWorld`` (its
torch ids renderer on the session's device); the truth is the same ``LiveWorld``'s stepper and RGB renderer
(``render_rgb``: the code world's source render, cropped and resized as the data were).

Every export of an eval plays the same scripts, and the world does not depend on what the model
draws: on a CPU, where the world's ids cost a third of a cell, a rank keeps each cell's ids by the
actions that led to it (``KeptCellsWorld``) and replays them for the next export; the sessions
every export plays whole are drawn by one rank for all (``draw_cells`` / ``keep_cells``, shared by
``eval.live_run.Truths``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig, GeometryConfig
from gc25d_core.deploy.world import FRAMES_PER_CELL, LiveWorld, WorldConfig
from gc25d_core.text import block_to_key, check_block

_RGB_WORLD: LiveWorld | None = None


def _rgb_frame(job: tuple[WorldConfig, GeometryConfig, Any]) -> np.ndarray:
    """One frame's RGB (a worker keeps its world: the scene is built once per process)."""
    global _RGB_WORLD
    cfg, geometry, state = job
    if _RGB_WORLD is None or _RGB_WORLD.cfg != cfg or _RGB_WORLD.geometry != geometry:
        _RGB_WORLD = LiveWorld(cfg, geometry)
    return _RGB_WORLD.render_rgb(state)


class KeptCellsWorld:
    """A ``LiveWorld`` whose cells are kept by the actions since ``reset`` that led to them: a
    session that replays a kept path gets a copy of the kept ids (what the world would draw); the
    world itself catches up on the path's untaken blocks when a session leaves it. The numpy
    renderer's cells only (host arrays); ``cells`` is shared by the sessions of one rank."""

    def __init__(self, world: LiveWorld, cells: dict[bytes, tuple[np.ndarray, str]]):
        if world.torch is not None:
            raise ValueError(
                "KeptCellsWorld keeps the numpy renderer's cells (host arrays), not the torch one's"
            )
        self.world, self.cells = world, cells
        self.stream = world.stream  # None: numpy ids are on the host
        self._path = b""  # the digest of the blocks since reset
        self._untaken: list[np.ndarray] = []  # blocks since the world last advanced itself

    def warm_up(self) -> None:
        self.world.warm_up()

    def reset(self, with_rgb: bool = True) -> tuple[np.ndarray | None, np.ndarray, str]:
        self._path, self._untaken = b"", []
        return self.world.reset(with_rgb)

    @staticmethod
    def step_path(path: bytes, block: np.ndarray) -> bytes:
        """The digest of the blocks since reset after one more, ``block``."""
        return hashlib.sha256(path + np.asarray(block, np.uint8).tobytes()).digest()

    @staticmethod
    def keep(
        cells: dict[bytes, tuple[np.ndarray, str]], blocks: Sequence[np.ndarray], ids: np.ndarray
    ) -> None:
        """Keep a whole session's cells, drawn elsewhere: ``ids`` uint8 [N, 4, H, W], the ids the
        world draws for ``blocks`` from reset (``DeployBackend.draw_cells``)."""
        path = b""
        for block, ids4 in zip(blocks, ids, strict=True):
            path = KeptCellsWorld.step_path(path, block)
            if path not in cells:
                kept = np.array(ids4, np.uint8)
                kept.flags.writeable = False
                cells[path] = (kept, block_to_key(check_block(block).astype(np.uint8)))

    def advance(self, block: np.ndarray) -> tuple[np.ndarray, str]:
        block = np.asarray(block, np.uint8)
        self._path = self.step_path(self._path, block)
        self._untaken.append(block)
        kept = self.cells.get(self._path)
        if kept is not None:  # a session's own copy: the runtime's tensors may share its memory
            return kept[0].copy(), kept[1]
        for b in self._untaken[:-1]:  # the world is where the last drawn cell left it
            self.world.advance(b)
        ids4, key = self.world.advance(block)
        assert isinstance(ids4, np.ndarray)
        self._untaken = []
        self.cells[self._path] = (ids4.copy(), key)  # kept apart from what this session is handed
        self.cells[self._path][0].flags.writeable = False
        return ids4, key


class DeployBackend:
    def __init__(
        self,
        cfg: Gc25dConfig,
        vae: Any,
        device: Any,
        world: WorldConfig | None = None,
        cuda_graphs: bool | None = None,
    ):
        """``cuda_graphs``: the sessions replay CUDA graphs (default: on a GPU; off: eagerly)."""
        self.cfg, self.vae, self.device = cfg, vae, device
        self.cuda_graphs = torch.device(device).type == "cuda" if cuda_graphs is None else cuda_graphs
        self.world = world or WorldConfig()
        # the truth's world: the same run spec, ids (unused) on the CPU
        self.ref = self.world.model_copy(update={"renderer": "numpy"})
        self._table: Any = None
        self._cells: dict[bytes, tuple[np.ndarray, str]] = {}  # KeptCellsWorld's, for every session

    def describe(self) -> dict[str, Any]:
        return self.ref.model_dump(exclude={"renderer"})

    def session(self, export: Path, sha256: str | None) -> Any:
        from gc25d_core.deploy.runtime import DeployRuntime, RuntimeOptions
        from gc25d_core.deploy.session import LiveSession
        from gc25d_core.text import load_text_table

        if self._table is None:
            self._table = load_text_table(self.cfg)
        runtime = DeployRuntime.load(
            export,
            self._table,
            self.vae,
            vocab=self.cfg.vocab,
            device=self.device,
            expected_sha256=sha256,
            # decode off: eval.live.play_rows decodes a session's rows as one batch. CUDA graphs on a
            # GPU: the same kernels replayed, so the exact path's latents bit for bit
            # (tests/deploy/test_static_kv.py's gpu test) without a small model's host-bound launches
            options=RuntimeOptions(decode=False, cuda_graphs=self.cuda_graphs),
        )
        world: Any = LiveWorld(self.world, self.cfg.geometry, device=self.device)
        if world.torch is None:  # the numpy renderer: a cell's ids cost more than its denoise
            world = KeptCellsWorld(world, self._cells)
        session = LiveSession(runtime, world, self.vae)
        session.prepare()
        return session

    @property
    def keeps_cells(self) -> bool:
        """The sessions replay kept cells (``KeptCellsWorld``: the numpy renderer's)."""
        return self.world.ids_renderer(self.device) == "numpy"

    def draw_cells(self, blocks: Sequence[np.ndarray]) -> np.ndarray:
        """The ids a session's world draws for ``blocks`` from reset, uint8 [N, 4, H, W] (numpy
        renderer): what ``keep_cells`` hands to the sessions of another rank."""
        world = LiveWorld(self.world, self.cfg.geometry, device=self.device)
        if world.torch is not None:
            raise ValueError("draw_cells: the torch renderer's sessions keep no cells")
        world.reset(with_rgb=False)
        return np.stack([np.asarray(world.advance(b)[0]) for b in blocks])

    def keep_cells(self, blocks: Sequence[np.ndarray], ids: np.ndarray) -> None:
        """Hand ``draw_cells(blocks)`` to this rank's sessions: they replay these cells."""
        KeptCellsWorld.keep(self._cells, blocks, ids)

    def states(self, blocks: Sequence[np.ndarray]) -> list[Any]:
        world = LiveWorld(self.ref, self.cfg.geometry)
        world.reset(with_rgb=False)
        assert world.stepper is not None and world.last_state is not None
        out = [world.last_state]
        for b in blocks:
            block = check_block(b).astype(np.uint8)
            out += [world.stepper.frame(block) for _ in range(FRAMES_PER_CELL)]
        return out

    def rgb_frames(self, states: Sequence[Any], workers: int) -> list[np.ndarray]:
        jobs = [(self.ref, self.cfg.geometry, s) for s in states]
        if workers > 1 and len(jobs) > 4 * workers:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawned, not forked: the eval draws the truth from a thread beside its sessions, and
            # a fork of a process with other threads (CUDA's, the session's) can copy a held lock
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                return list(pool.map(_rgb_frame, jobs, chunksize=8))
        return [_rgb_frame(j) for j in jobs]
