"""The inference-time code world (SPEC §3): a live run stepped by the player's action blocks.

``LiveWorld.reset()`` makes frame 0 (the anchor: its RGB render and ids); ``advance(block)`` steps
the 4 frames of the next cell under ``block`` (uint8 [5], text.py format) through the code world's
own dynamics (``codeworld.sim.RunStepper``: the player follows the block, the boss its AI) and
returns their "parts" ids and the cell's prompt key. Ids per frame: the static semantic layer
(ray cast against the scene on the destination grid, exactly the pixels ``resample_ids`` samples)
with the characters drawn over it by ``capsules.render_capsules`` (occluded by the scene's depth).

Unseen world = UNKNOWN (255), as the extension canvas and the UNKNOWN masking of training mark it:
a static pixel is known only if its surface point (world x, y on a ``seen_cell_cm`` grid) was
visible in a frame of an earlier cell (the anchor counts: its view is what the model was given).
What a cell reveals for the first time is the model's to invent; from the next cell on it carries
the world's ids. Sky (content at infinity, in the anchor's view) is always known; characters are
never masked (as in training).

Two renderers give these ids: ``renderer="torch"`` (``codeworld.torch_render``, the cell's 4
frames as batched tensor ops on the session's device, ids stay there) and ``renderer="numpy"``
(the reference: the data generator's CPU ray cast, one frame at a time). The default, ``auto``,
takes torch on a GPU and numpy on a CPU, where the ray cast is the faster of the two (at the
embedded default's 128×64 on one thread: 31 ms a cell against 82 ms).
The torch ids agree with the reference on ≥ 99.9 % of pixels (tests/deploy/test_world_torch.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from gc25d_core.capsules import render_capsules
from gc25d_core.codeworld.camera import CAMERA_VARIANTS, camera_matrices
from gc25d_core.codeworld.presets import stable_seed
from gc25d_core.codeworld.render import render_frame
from gc25d_core.codeworld.scene import GROUND_EXTENT_CM, GridRays, StaticScene, build_scene, render_static
from gc25d_core.codeworld.shade import STYLES
from gc25d_core.codeworld.sim import FrameState, LookSpan, RunSpec, RunStepper
from gc25d_core.codeworld.torch_render import SKY_CELL, SeenGrid, TorchWorldRenderer
from gc25d_core.config import GeometryConfig
from gc25d_core.geometry import index_maps, resample_rgb
from gc25d_core.schema import Strict
from gc25d_core.text import block_to_key, check_block
from gc25d_core.vocab import NUM_STATIC, UNKNOWN, check_ids

FRAMES_PER_CELL = 4
SKY = SKY_CELL  # seen-grid cell of a pixel without a static surface (always known)
_LIVE_FRAMES = 10**9  # a live run has no end; the spec needs a length


class WorldConfig(Strict):
    """Which code world the session plays in (deterministic given the fields)."""

    scene: str = Field(default="ashen_keep", description="scene name (seeds the layout)")
    seed: int = Field(default=0, description="seed of the fight (spawn, boss AI) and the set dressing")
    style: str = Field(default="real", description=f"RGB style of the anchor render: {sorted(STYLES)}")
    camera: str = Field(default="tp_default", description=f"camera variant: {sorted(CAMERA_VARIANTS)}")
    framed: bool = Field(default=False, description="P9-style lagging, drifting camera aim")
    seen_cell_cm: float = Field(default=100.0, gt=0, description="grid of the seen-world memory")
    renderer: Literal["auto", "torch", "numpy"] = Field(
        default="auto",
        description="ids renderer: torch on the session's device, or numpy on the CPU (the reference); "
        "auto: torch on a GPU, numpy on a CPU (the same ids; numpy is the faster one there)",
    )

    def ids_renderer(self, device: Any) -> Literal["torch", "numpy"]:
        """The renderer a world on ``device`` draws its ids with (``renderer`` with auto resolved)."""
        if self.renderer != "auto":
            return self.renderer
        return "torch" if torch.device(device).type == "cuda" else "numpy"

    def run_spec(self) -> RunSpec:
        if self.style not in STYLES:
            raise ValueError(f"world.style={self.style!r} is not one of {sorted(STYLES)}")
        if self.camera not in CAMERA_VARIANTS:
            raise ValueError(f"world.camera={self.camera!r} is not one of {sorted(CAMERA_VARIANTS)}")
        return RunSpec(
            subset="live",
            scene=self.scene,
            run=f"live_s{self.seed}",
            num_frames=_LIVE_FRAMES,
            seed=stable_seed(self.seed, "live", self.scene),
            scene_seed=stable_seed(self.seed, self.scene),
            style=self.style,
            framed=self.framed,
            cameras=((0, self.camera),),
            looks=(LookSpan(0, "live", stable_seed(self.seed, self.scene, "look")),),
        )


class SeenMemory:
    """Which world cells (x, y on a square grid) some earlier frame showed."""

    def __init__(self, cell_cm: float, extent_cm: float = GROUND_EXTENT_CM):
        self.cell_cm, self.extent_cm = cell_cm, extent_cm
        self.n = int(np.ceil(2 * extent_cm / cell_cm))
        self.seen = np.zeros((self.n, self.n), bool)

    def cells_of(self, xy: np.ndarray) -> np.ndarray:
        """Flat grid index per point [..., 2] (-1 outside the grid or not finite)."""
        with np.errstate(invalid="ignore"):
            ij = np.floor((xy + self.extent_cm) / self.cell_cm)
        ok = np.asarray(np.isfinite(ij).all(-1) & (ij >= 0).all(-1) & (ij < self.n).all(-1))
        ij = np.where(ok[..., None], ij, 0).astype(np.int64)
        return np.where(ok, ij[..., 0] * self.n + ij[..., 1], -1)

    def known(self, cells: np.ndarray) -> np.ndarray:
        return (cells >= 0) & self.seen.reshape(-1)[np.maximum(cells, 0)]

    def mark(self, cells: np.ndarray) -> None:
        self.seen.reshape(-1)[cells[cells >= 0]] = True


class LiveWorld:
    """The live run. ``advance`` returns the cell's ids as a uint8 tensor on ``device`` (torch
    renderer) or a numpy array (numpy renderer); ``times`` holds the last cell's host seconds of the
    dynamics (``sim``) and the ids (``render``: launch time only on a GPU, where it runs async).

    On a GPU the ids render on the world's own ``stream``: the caller's stream still holds the
    previous cell's deferred commit, and the render (its uploads included, which would wait for
    that stream) runs beside it; the caller's stream waits for the ids before it reads them."""

    def __init__(
        self,
        cfg: WorldConfig,
        geometry: GeometryConfig,
        device: Any = "cpu",
        dtype: torch.dtype = torch.float64,
    ):
        self.cfg, self.geometry = cfg, geometry
        self.spec = cfg.run_spec()
        self._scenes: dict[int, StaticScene] = {}
        self.stepper: RunStepper | None = None
        self.memory = SeenMemory(cfg.seen_cell_cm)
        self.torch: TorchWorldRenderer | None = None
        self.grid: SeenGrid | None = None
        self.renderer = cfg.ids_renderer(device)
        if self.renderer == "torch":
            self.torch = TorchWorldRenderer(geometry, device, dtype, cfg.seen_cell_cm)
            self.grid = SeenGrid(self.torch.n, self.torch.device)
        dev = self.torch.device if self.torch is not None else None
        self.stream = torch.cuda.Stream(dev) if dev is not None and dev.type == "cuda" else None
        self.frames = 0
        self.last_state: FrameState | None = None
        self.times: dict[str, float] = {"sim": 0.0, "render": 0.0}
        self._frame0: tuple[np.ndarray, Any, np.ndarray | None] | None = None  # ids, cells, rgb

    def _on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def scene_of(self, look: LookSpan) -> StaticScene:
        if look.seed not in self._scenes:
            self._scenes[look.seed] = build_scene(self.spec.scene_seed, look.seed)
        return self._scenes[look.seed]

    # -- rendering ---------------------------------------------------------------------------------

    def render_ids(self, state: FrameState) -> tuple[np.ndarray, np.ndarray]:
        """(unmasked parts ids uint8 [H, W], the seen-grid cell of each pixel's static surface:
        ``SKY`` where there is none, -1 off the grid — never known)."""
        g = self.geometry
        cam = camera_matrices(state.camera, g.src_width, g.src_height)
        idx_y, idx_x = index_maps(g)
        rays = GridRays.build(
            idx_x.astype(np.float64),
            idx_y.astype(np.float64),
            cam.world_to_clip,
            cam.world_to_view,
            g.src_width,
            g.src_height,
        )
        static = render_static(self.scene_of(state.look), rays)
        finite = np.isfinite(static.t)
        points = rays.origin + np.where(finite, static.t, 0.0)[..., None] * rays.direction
        cells = np.where(finite, self.memory.cells_of(points[..., :2]), SKY)
        ids = render_capsules(
            state.capsules, cam.world_to_clip, cam.world_to_view, static.cls, g, background_depth=static.t
        )
        return ids, cells

    def render_ids_torch(self, states: list[FrameState]) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch renderer over frames (one batch per run of frames under one look):
        (unmasked ids uint8 [F, H, W], seen-grid cells int64 [F, H, W]) on the device."""
        assert self.torch is not None
        g = self.geometry
        ids, cells = [], []
        start = 0
        while start < len(states):
            look = states[start].look
            end = start + 1
            while end < len(states) and states[end].look == look:
                end += 1
            cams = [camera_matrices(s.camera, g.src_width, g.src_height) for s in states[start:end]]
            i, c = self.torch.render(
                self.scene_of(look),
                np.stack([m.world_to_clip for m in cams]),
                np.stack([m.world_to_view for m in cams]),
                np.stack([s.capsules for s in states[start:end]]),
            )
            ids.append(i)
            cells.append(c)
            start = end
        if len(ids) == 1:
            return ids[0], cells[0]
        return torch.cat(ids), torch.cat(cells)

    def warm_up(self) -> None:
        """Load-time: one cell-sized batch through the torch renderer (its compile on a GPU)."""
        if self.torch is None:
            return
        stepper = RunStepper(self.spec, self.scene_of)
        states = [stepper.frame(np.zeros(5, np.uint8)) for _ in range(FRAMES_PER_CELL)]
        with self._on_stream():
            self.render_ids_torch(states)
        if self.torch.device.type == "cuda":
            torch.cuda.synchronize(self.torch.device)

    def render_rgb(self, state: FrameState) -> np.ndarray:
        """The frame's RGB at the destination geometry (source render, then crop + resize)."""
        g = self.geometry
        texture_seed = stable_seed(self.spec.scene_seed, "texture")
        img = render_frame(
            self.scene_of(state.look), state, g.src_width, g.src_height, self.spec.style, texture_seed
        )
        return resample_rgb(img.rgb, g)

    # -- stepping ----------------------------------------------------------------------------------

    def reset(self, with_rgb: bool = True) -> tuple[np.ndarray | None, np.ndarray, str]:
        """Frame 0: (its RGB uint8 [H, W, 3] or None, its ids uint8 [1, H, W] all known, the prompt
        key of cell 0 — idle, the action of no block)."""
        self.stepper = RunStepper(self.spec, self.scene_of)
        self.memory = SeenMemory(self.cfg.seen_cell_cm)
        idle = np.zeros(5, np.uint8)
        state = self.stepper.frame(idle)
        # frame 0 depends on the config alone: rendered once (at load, see LiveSession.prepare)
        # and reused by every later reset
        if self._frame0 is None:
            if self.torch is not None:
                ids_t, cells_t = self.render_ids_torch([state])
                self._frame0 = (ids_t[0].cpu().numpy(), cells_t, None)
            else:
                self._frame0 = (*self.render_ids(state), None)
        ids, cells, rgb = self._frame0
        if with_rgb and rgb is None:
            rgb = self.render_rgb(state)
            self._frame0 = (ids, cells, rgb)
        if self.torch is not None:
            assert isinstance(cells, torch.Tensor)
            self.grid = SeenGrid(self.torch.n, self.torch.device)
            self.grid.mark(cells)
            if self.stream is not None:  # the world's stream reads the grid made here
                self.stream.wait_stream(torch.cuda.current_stream(self.torch.device))
        else:
            assert isinstance(cells, np.ndarray)
            self.memory.mark(cells)
        self.frames, self.last_state = 1, state
        return (rgb if with_rgb else None), ids[None], block_to_key(idle)

    def advance(self, block: np.ndarray) -> tuple[np.ndarray | torch.Tensor, str]:
        """The next cell under ``block``: (its 4 frames of ids uint8 [4, H, W] — a tensor on the
        device with the torch renderer, a numpy array with the numpy one —, its prompt key)."""
        if self.stepper is None:
            raise RuntimeError("LiveWorld.advance before reset()")
        block = check_block(block).astype(np.uint8)
        if self.torch is not None:
            return self._advance_torch(block), block_to_key(block)
        t0 = time.perf_counter()
        out, seen_now = [], []
        for _ in range(FRAMES_PER_CELL):
            state = self.stepper.frame(block)
            ids, cells = self.render_ids(state)
            # only static pixels are masked: characters drawn over the scene keep their parts
            unseen = (ids < NUM_STATIC) & (cells != SKY) & ~self.memory.known(cells)
            out.append(np.where(unseen, np.uint8(UNKNOWN), ids).astype(np.uint8))
            seen_now.append(cells)
            self.last_state = state
        for cells in seen_now:  # known from the next cell on
            self.memory.mark(cells)
        self.frames += FRAMES_PER_CELL
        ids4 = np.stack(out)
        check_ids(ids4, "parts", "code world ids")
        self.times = {"sim": 0.0, "render": time.perf_counter() - t0}  # the two interleave here
        return ids4, block_to_key(block)

    def _advance_torch(self, block: np.ndarray) -> torch.Tensor:
        assert self.stepper is not None and self.grid is not None
        t0 = time.perf_counter()
        states = [self.stepper.frame(block) for _ in range(FRAMES_PER_CELL)]
        t1 = time.perf_counter()
        with self._on_stream():
            ids, cells = self.render_ids_torch(states)
            out = self.grid.mask(ids, cells)  # what earlier cells showed; this cell's view counts next
            self.grid.mark(cells)
        if self.stream is not None:
            reader = torch.cuda.current_stream(out.device)
            reader.wait_stream(self.stream)
            out.record_stream(reader)  # made on the world's stream, read on the caller's
        self.frames += FRAMES_PER_CELL
        self.last_state = states[-1]
        self.times = {"sim": t1 - t0, "render": time.perf_counter() - t1}
        return out


_REF_WORLD: LiveWorld | None = None


def _reference_frame(args: tuple[WorldConfig, GeometryConfig, FrameState]) -> tuple[np.ndarray, np.ndarray]:
    global _REF_WORLD
    cfg, geometry, state = args
    if _REF_WORLD is None or _REF_WORLD.cfg != cfg or _REF_WORLD.geometry != geometry:
        _REF_WORLD = LiveWorld(cfg, geometry)
    return _REF_WORLD.render_ids(state)


def reference_ids(
    cfg: WorldConfig, geometry: GeometryConfig, blocks: list[np.ndarray], workers: int = 1
) -> list[np.ndarray]:
    """The numpy renderer's ids of a session (frame 0 uint8 [1, H, W], then [4, H, W] per block),
    its frames ray-cast by ``workers`` processes: a frame's render depends on its state alone, only
    the seen memory is sequential (the same arithmetic as ``LiveWorld.advance``). What the torch
    renderer is checked against at full size, where the CPU ray cast takes ≈ 1 s a frame."""
    from concurrent.futures import ProcessPoolExecutor

    ref = cfg.model_copy(update={"renderer": "numpy"})
    world = LiveWorld(ref, geometry)
    _, ids0, _ = world.reset(with_rgb=False)
    assert world.stepper is not None
    states = [
        world.stepper.frame(check_block(b).astype(np.uint8)) for b in blocks for _ in range(FRAMES_PER_CELL)
    ]
    jobs = [(ref, geometry, s) for s in states]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            frames = list(pool.map(_reference_frame, jobs, chunksize=4))
    else:
        frames = [_reference_frame(j) for j in jobs]
    memory = SeenMemory(cfg.seen_cell_cm)
    assert world._frame0 is not None
    memory.mark(world._frame0[1])
    out = [ids0]
    for c in range(len(blocks)):
        cell = frames[FRAMES_PER_CELL * c : FRAMES_PER_CELL * (c + 1)]
        masked = []
        for ids, cells in cell:
            unseen = (ids < NUM_STATIC) & (cells != SKY) & ~memory.known(cells)
            masked.append(np.where(unseen, np.uint8(UNKNOWN), ids).astype(np.uint8))
        for _, cells in cell:
            memory.mark(cells)
        out.append(np.stack(masked))
    return out


def varied_blocks(n: int, seed: int = 0) -> list[np.ndarray]:
    """A player's random action stream for benchmarks and tests: blocks of moves, turns, runs,
    attacks, dodges and stances, each held 1-6 cells (seeded)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    while len(out) < n:
        block = np.array(
            [
                rng.integers(0, 9),
                rng.integers(0, 2),
                rng.integers(0, 3),
                rng.integers(0, 2),
                rng.integers(0, 3),
            ],
            np.uint8,
        )
        out += [block] * int(rng.integers(1, 7))
    return out[:n]
