"""The deploy package's live session and code world as the eval's live sweeps play them
(``gc25d_core.eval.live.LiveBackend``): eval and deploy are peers that never import one another, so
the job layer joins them.

The session is ``deploy.session.LiveSession`` on ``DeployRuntime.load`` (default runtime options:
seed 0, eager; the job's VAE and text table) and ``deploy.world.LiveWorld`` (its torch ids
renderer on the session's device); the truth is the same ``LiveWorld``'s stepper and RGB renderer
(``render_rgb``: the code world's source render, cropped and resized as the data were).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gc25d_core.config import Gc25dConfig, GeometryConfig
from gc25d_core.deploy.world import FRAMES_PER_CELL, LiveWorld, WorldConfig

_RGB_WORLD: LiveWorld | None = None


def _rgb_frame(job: tuple[WorldConfig, GeometryConfig, Any]) -> np.ndarray:
    """One frame's RGB (a worker keeps its world: the scene is built once per process)."""
    global _RGB_WORLD
    cfg, geometry, state = job
    if _RGB_WORLD is None or _RGB_WORLD.cfg != cfg or _RGB_WORLD.geometry != geometry:
        _RGB_WORLD = LiveWorld(cfg, geometry)
    return _RGB_WORLD.render_rgb(state)


class DeployBackend:
    def __init__(self, cfg: Gc25dConfig, vae: Any, device: Any, world: WorldConfig | None = None):
        self.cfg, self.vae, self.device = cfg, vae, device
        self.world = world or WorldConfig()
        # the truth's world: the same run spec, ids (unused) on the CPU
        self.ref = self.world.model_copy(update={"renderer": "numpy"})
        self._table: Any = None

    def describe(self) -> dict[str, Any]:
        return self.ref.model_dump(exclude={"renderer"})

    def session(self, export: Path, sha256: str | None) -> Any:
        from gc25d_core.deploy.runtime import DeployRuntime
        from gc25d_core.deploy.session import LiveSession
        from gc25d_core.text import load_text_table

        if self._table is None:
            self._table = load_text_table(self.cfg)
        runtime = DeployRuntime.load(
            export, self._table, self.vae, vocab=self.cfg.vocab, device=self.device, expected_sha256=sha256
        )
        session = LiveSession(runtime, LiveWorld(self.world, self.cfg.geometry, device=self.device), self.vae)
        session.prepare()
        return session

    def states(self, blocks: Sequence[np.ndarray]) -> list[Any]:
        from gc25d_core.text import check_block

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
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(workers) as pool:
                return list(pool.map(_rgb_frame, jobs, chunksize=8))
        return [_rgb_frame(j) for j in jobs]
