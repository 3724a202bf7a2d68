"""Live sessions scored against the code world's truth: the sweeps ``live240`` (60 s) and
``live2400`` (10 min).

A session is a seeded action script (``session_script``: walking, turning, running, fighting, then
walking back to places seen earlier) played by a causal export through the deploy session code
(``gc25d_core.deploy.session.LiveSession``: the code world makes each cell's ids and prompt, the
runtime denoises and decodes the cell). The same script stepped by the same dynamics
(``codeworld.sim.RunStepper``) and drawn by the code world's RGB renderer is the truth
(``render_truth``): the frames a player would have seen had the model been perfect.

Each export plays three rollouts from the same anchor (the world's frame 0, VAE-encoded) and the
same noise (the runtime reseeds its generator at every start):

* ``own``: the script; scored against the truth (PSNR, SSIM, latent error where the VAE encodes the
  truth, boundary flicker, revisits; per segment);
* ``other``: another script's session in the same world (its ids and prompts), scored against the
  own truth: ΔtPSNR = PSNR(own) − PSNR(other) says whether the frames follow the ids;
* ``changed``: the script with the action of cell ``change_cell`` replaced, rolled ``after_cells``
  past it: a causal model's frames before the change are bit-identical to ``own``'s, the frames
  after it move (as much as the truth's do) toward the changed truth.

Scoring lives in ``gc25d_core.eval.live_score``; this module plays and renders. The deploy code
is a peer of eval (the layering contract: neither imports the other), so the session and the world
come in through a ``LiveBackend``: ``gc25d_core.jobs.eval_live.DeployBackend`` is the deploy
package's (the job passes it to ``eval.run.run_eval``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.eval.metrics import FRAMES_PER_CELL

CELLS_PER_SECOND = 4  # one 0.25 s action block per latent cell (SPEC §3)
KINDS = ("own", "other", "changed")


@dataclass(frozen=True)
class LiveSweep:
    """One live sweep: ``cells`` cells after the anchor, scored per ``segment_cells``."""

    name: str
    cells: int
    segment_cells: int
    change_cell: int = 24  # the action changed here in the sensitivity probe (cell ≥ 1)
    after_cells: int = 16  # cells rolled after the change (4 s)
    revisit_gap: int = 40  # a place is revisited when the camera returns ≥ 10 s later
    script_seed: int = 0  # the scored session's script; ``other`` plays script_seed + 1

    def segments(self) -> list[tuple[int, int]]:
        """Inclusive cell ranges of the segments (cell 0, the anchor, belongs to none)."""
        return [
            (a, min(a + self.segment_cells - 1, self.cells))
            for a in range(1, self.cells + 1, self.segment_cells)
        ]

    def rollout_cells(self, kind: str) -> int:
        return self.change_cell + self.after_cells - 1 if kind == "changed" else self.cells

    def definition(self) -> dict[str, Any]:
        return asdict(self)


LIVE_SWEEPS: dict[str, LiveSweep] = {
    "live240": LiveSweep("live240", cells=240, segment_cells=40),  # 60 s in 10 s segments
    "live2400": LiveSweep("live2400", cells=2400, segment_cells=240),  # 10 min in 1 min segments
}


def default_live_sweeps(cfg: Gc25dConfig) -> list[str]:
    """The embedded default (a CPU preset) plays one minute, the GPU presets ten."""
    return ["live240"] if cfg.device == "cpu" else ["live2400"]


def default_live_ceiling(cfg: Gc25dConfig) -> bool:
    """The truth through the VAE beside the exports on the GPU presets, where one more decode of a
    session costs seconds; the embedded default leaves it out of `make run`'s CPU budget."""
    return cfg.device != "cpu"


def live_sweep(name: str, cells: int | None = None) -> LiveSweep:
    """A sweep by name; ``cells`` shortens it (tests), keeping its segments' length where it fits."""
    if name not in LIVE_SWEEPS:
        raise ValueError(f"live sweep {name!r} is not one of {sorted(LIVE_SWEEPS)}")
    sweep = LIVE_SWEEPS[name]
    if cells is None:
        return sweep
    seg = min(sweep.segment_cells, cells)
    change = min(sweep.change_cell, max(1, cells // 2))
    after = min(sweep.after_cells, cells - change + 1)
    return LiveSweep(name, cells, seg, change, after, min(sweep.revisit_gap, cells))


# ------------------------------------------------------------------------------------------------
# the action script


def _block(move: int = 0, run: int = 0, attack: int = 0, dodge: int = 0, stance: int = 0) -> np.ndarray:
    return np.array([move, run, attack, dodge, stance], np.uint8)


# move codes (gc25d_core.deploy.actions): 1 fwd, 2 back, 3 left, 4 right, 5 fwd_left, 6 fwd_right,
# 7 back_left, 8 back_right
_REVERSE = {0: 0, 1: 2, 2: 1, 3: 4, 4: 3, 5: 8, 6: 7, 7: 6, 8: 5}
# light, heavy attack, dodge, guard, side steps
_FIGHT = (_block(attack=1), _block(attack=2), _block(dodge=1), _block(stance=2), _block(3), _block(4))


def session_script(seed: int, num_cells: int) -> list[np.ndarray]:
    """``num_cells`` action blocks (cells 1..N), the same for a seed. Each minute: walk out (forward
    with drifts), turn, run, fight the boss (attacks, dodges, guard), then go back the way it came
    (the outbound moves reversed, so the camera returns to places seen a minute before), then idle
    and look around."""
    rng = np.random.default_rng([seed, 35])
    out: list[np.ndarray] = []
    while len(out) < num_cells:
        outbound: list[np.ndarray] = []
        for _ in range(int(rng.integers(6, 10))):  # walking, in strides of 4 cells (1 s)
            outbound += [_block(int(rng.choice([1, 1, 5, 6])))] * 4
        for _ in range(int(rng.integers(2, 4))):  # turning
            outbound += [_block(int(rng.choice([3, 4, 5, 6])))] * 4
        for _ in range(int(rng.integers(4, 7))):  # running
            outbound += [_block(int(rng.choice([1, 5, 6])), run=1)] * 4
        fight: list[np.ndarray] = []
        for _ in range(int(rng.integers(16, 24))):  # fighting, two cells an action
            fight += [_FIGHT[int(rng.integers(0, len(_FIGHT)))]] * 2
        back = [_block(_REVERSE[int(b[0])], run=int(b[1])) for b in reversed(outbound)]  # revisits
        rest = [_block(int(rng.choice([0, 0, 3, 4])))] * int(rng.integers(8, 20))
        out += outbound + fight + back + rest
    return out[:num_cells]


def changed_script(blocks: Sequence[np.ndarray], cell: int) -> list[np.ndarray]:
    """``blocks`` with the action of ``cell`` (≥ 1) replaced by a sharp turn + a heavy attack, or a
    dodge where that was the action already."""
    if not 1 <= cell <= len(blocks):
        raise ValueError(f"change cell {cell} is not one of the script's cells 1..{len(blocks)}")
    out = [b.copy() for b in blocks]
    new = _block(4, run=1, attack=2)
    out[cell - 1] = new if not np.array_equal(out[cell - 1], new) else _block(dodge=1)
    return out


# ------------------------------------------------------------------------------------------------
# the truth: the same blocks through the same dynamics, drawn by the RGB renderer


@dataclass
class Truth:
    frames: np.ndarray  # uint8 [1 + 4N, h, w, 3] (frame 0: the anchor the session encodes)
    eye: np.ndarray  # float [N + 1, 3] the camera eye at each cell's last frame (cm)
    yaw: np.ndarray  # float [N + 1] its yaw (rad)


class LiveBackend(Protocol):
    """The live session code the sweeps play through, and the world that is the truth."""

    def describe(self) -> dict[str, Any]:
        """What the world is (scene, seed, style, camera): part of a result's key."""
        ...

    def session(self, export: Path, sha256: str | None) -> Any:
        """A session with its decode off: ``start()``, ``step(block)`` -> out (.out.latent / .ids),
        ``ids0``, ``anchor_latent``, ``runtime.decode_rows(latents)`` (``deploy.session.LiveSession``)."""
        ...

    @property
    def keeps_cells(self) -> bool:
        """The sessions replay cells kept by their actions (``draw_cells`` / ``keep_cells`` apply)."""
        ...

    def draw_cells(self, blocks: Sequence[np.ndarray]) -> np.ndarray:
        """The cells' ids a session's world draws for ``blocks`` (an array to share with other ranks)."""
        ...

    def keep_cells(self, blocks: Sequence[np.ndarray], ids: np.ndarray) -> None:
        """Hand ``draw_cells(blocks)`` to this process's sessions."""
        ...

    def states(self, blocks: Sequence[np.ndarray]) -> list[Any]:
        """The world's frame states: frame 0, then 4 per block (``.camera.eye`` / ``.camera.yaw``)."""
        ...

    def rgb_frames(self, states: Sequence[Any], workers: int) -> list[np.ndarray]:
        """The RGB renderer's frames (uint8 [h, w, 3]) of ``states``, over ``workers`` processes."""
        ...


def render_truth(
    backend: LiveBackend,
    blocks: Sequence[np.ndarray],
    *,
    workers: int = 1,
    frames_out: np.ndarray | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Truth:
    """The truth of a session. With ``frames_out`` (a shared memory map) this rank draws only the
    frames f with f % world_size == rank into it (the others draw the rest); a frame depends on
    its state alone."""
    states = backend.states(blocks)
    mine = list(range(rank, len(states), world_size))
    drawn = backend.rgb_frames([states[f] for f in mine], workers)
    if frames_out is None:
        frames_out = np.zeros((len(states), *drawn[0].shape), np.uint8)
    for f, img in zip(mine, drawn, strict=True):
        frames_out[f] = img
    last = [states[0]] + [states[FRAMES_PER_CELL * c] for c in range(1, len(blocks) + 1)]
    return Truth(
        frames=frames_out,
        eye=np.array([s.camera.eye for s in last], np.float64),
        yaw=np.array([s.camera.yaw for s in last], np.float64),
    )


POOL_MIN_FRAMES = 2000  # a session this long draws its truth in a process pool


def truth_workers(num_frames: int, world_size: int) -> int:
    """Processes per rank for the truth's ray casts: one on a short session (a pool's start costs
    more than it saves), else this rank's share of the cores (at most 8)."""
    if num_frames < POOL_MIN_FRAMES:
        return 1
    return max(1, min(8, (os.cpu_count() or 1) // max(1, world_size)))


def truth_latents(vae: Any, frames: np.ndarray) -> torch.Tensor:
    """The VAE's encode of the truth, one causal encode of the whole session: [48, N + 1, H, W]
    (cell k ≥ 1 = frames 4k−3 … 4k, as the session's cells)."""
    from gc25d_core.models.vae import encode_frames

    return encode_frames(vae, frames).cpu()


def ceiling_psnr(session: Any, truth_latent: torch.Tensor, frames: np.ndarray, cap: float) -> list[float]:
    """PSNR per frame of the truth's encode decoded by ``session``'s runtime, the decode its rollouts
    take: the picture of a model whose latents were the truth's, the most this VAE lets a session show."""
    from gc25d_core.eval.metrics import psnr_per_frame

    decoded = session.runtime.decode_rows([truth_latent.float()])[0]
    return psnr_per_frame(decoded, frames[: decoded.shape[0]], cap)


# ------------------------------------------------------------------------------------------------
# playing a session through the deploy code


@dataclass
class Played:
    frames: np.ndarray  # uint8 [1 + 4N, h, w, 3] decoded
    latents: torch.Tensor  # float32 [48, N, H, W]: cells 1..N (cell 0 is the anchor's encode)
    ids: np.ndarray  # uint8 [1 + 4N, h, w]: the ids that conditioned them


@torch.no_grad()
def play(session: Any, blocks: Sequence[np.ndarray]) -> Played:
    """One rollout: ``start`` (the anchor, the noise reseeded), then one ``step`` per block."""
    return play_rows(session, [blocks])[0]


@torch.no_grad()
def play_rows(
    session: Any, scripts: Sequence[Sequence[np.ndarray]], times: dict[str, float] | None = None
) -> list[Played]:
    """Rollouts of one session, each from its ``start`` (the anchor, the noise reseeded), with the
    session's decode off (``RuntimeOptions.decode``); the scripts of one length are then decoded
    as one batch (``runtime.decode_rows``): on a CPU the decode is most of a cell's time, and two
    rows decode in about 0.6 of the time of two. ``times`` gets the seconds of the two parts
    (``play_s``, ``decode_s``)."""
    t0 = time.perf_counter()
    rolled = []
    for blocks in scripts:
        session.start()
        ids = [np.asarray(session.ids0, np.uint8).reshape(-1, *session.ids0.shape[-2:])]
        latents = []
        for b in blocks:
            out = session.step(b)
            ids.append(out.ids)
            latents.append(out.out.latent[0, :, 0].float().cpu())
        rolled.append((torch.stack(latents, dim=1), np.concatenate(ids)))
    anchor = session.anchor_latent[0].float().cpu()  # [48, 1, h, w]
    t1 = time.perf_counter()
    frames: dict[int, np.ndarray] = {}
    for n in sorted({len(s) for s in scripts}):
        rows = [i for i, s in enumerate(scripts) if len(s) == n]
        decoded = session.runtime.decode_rows([torch.cat([anchor, rolled[i][0]], dim=1) for i in rows])
        frames.update(zip(rows, decoded, strict=True))
    if times is not None:
        times.update(play_s=t1 - t0, decode_s=time.perf_counter() - t1)
    return [Played(frames[i], lat, ids) for i, (lat, ids) in enumerate(rolled)]
