"""SPEC §2: 81 frames = 21 latent cells; cell 0 = frame 0, cell j = frames 4j−3…4j.

Action blocks are 0.25 s = 4 frames: block b of a clip starting at s covers frames s+4b … s+4b+3,
so cell j ≥ 1 takes block j−1 and cell 0 repeats cell 1. Clips start on multiples of 96 and end
exclusive (s + 81). The rollout extension (stage 3) adds cells 21..27 = frames s+81 … s+108 with
blocks s//4+20 … s//4+26, valid only when frames s … s+108 share episode and camera_variant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gc25d_core.config import TimelineConfig

V10 = TimelineConfig()


def cell_frames(cell: int, tl: TimelineConfig = V10) -> list[int]:
    """Clip-relative frames of latent cell ``cell`` (extension cells continue past num_cells − 1)."""
    if cell < 0:
        raise ValueError(f"cell must be >= 0, got {cell}")
    if cell == 0:
        return [0]
    f = tl.frames_per_cell
    return list(range(f * cell - (f - 1), f * cell + 1))


def frame_to_cell(frame: int, tl: TimelineConfig = V10) -> int:
    """Inverse of ``cell_frames``: frame 0 → 0, frames 1..4 → 1, …, 77..80 → 20."""
    if frame < 0:
        raise ValueError(f"frame must be >= 0, got {frame}")
    return (frame + tl.frames_per_cell - 1) // tl.frames_per_cell


def check_clip_start(start: int, tl: TimelineConfig = V10) -> None:
    if start < 0 or start % tl.clip_stride:
        raise ValueError(f"clip start {start} must be a non-negative multiple of {tl.clip_stride}")


def clip_end(start: int, tl: TimelineConfig = V10) -> int:
    """Exclusive end frame of a clip."""
    check_clip_start(start, tl)
    return start + tl.num_frames


def clip_starts(num_frames_in_run: int, tl: TimelineConfig = V10) -> list[int]:
    """Every start ∈ stride·ℤ whose clip fits inside a run of ``num_frames_in_run`` frames."""
    return list(range(0, num_frames_in_run - tl.num_frames + 1, tl.clip_stride))


def block_offset(start: int, tl: TimelineConfig = V10) -> int:
    check_clip_start(start, tl)
    return start // tl.frames_per_cell


def _slice_blocks(actions_block: np.ndarray, lo: int, n: int, what: str) -> np.ndarray:
    actions_block = np.asarray(actions_block)
    if actions_block.ndim != 2:
        raise ValueError(f"actions_block must be [N,5], got shape {actions_block.shape}")
    if lo + n > len(actions_block):
        raise ValueError(f"{what}: needs blocks {lo}..{lo + n - 1}, actions_block has {len(actions_block)}")
    return actions_block[lo : lo + n].astype(np.uint8)


def blocks20(actions_block: np.ndarray, start: int, tl: TimelineConfig = V10) -> np.ndarray:
    """actions_block_0.25s.npy[s//4 : s//4+20] → uint8 [20,5]."""
    return _slice_blocks(actions_block, block_offset(start, tl), tl.num_blocks, f"clip start {start}")


def ext_blocks(actions_block: np.ndarray, start: int, tl: TimelineConfig = V10) -> np.ndarray:
    """Extension blocks s//4+20 … s//4+26 → uint8 [7,5]."""
    lo = block_offset(start, tl) + tl.num_blocks
    return _slice_blocks(actions_block, lo, tl.num_ext_cells, f"extension of clip start {start}")


def cell_blocks(blocks: np.ndarray) -> np.ndarray:
    """[20,5] → [21,5]: cell 0 repeats cell 1 (block 0), cell j takes block j−1."""
    blocks = np.asarray(blocks)
    if blocks.ndim != 2 or len(blocks) < 1:
        raise ValueError(f"blocks must be [N,5] with N >= 1, got shape {blocks.shape}")
    return np.concatenate([blocks[:1], blocks], axis=0)


def extension_frames(start: int, tl: TimelineConfig = V10) -> list[int]:
    """Absolute frames of extension cells 21..27: s+81 … s+108."""
    end = clip_end(start, tl)
    return list(range(end, end + tl.num_ext_frames))


def extension_valid(
    episodes: Sequence[object],
    camera_variants: Sequence[object],
    start: int,
    tl: TimelineConfig = V10,
) -> bool:
    """True iff frames s … s+108 exist and share one episode and one camera_variant.

    ``episodes`` / ``camera_variants`` are per-frame values of the whole run (index = frame).
    """
    last = clip_end(start, tl) + tl.num_ext_frames  # exclusive: s+109
    if last > len(episodes) or last > len(camera_variants):
        return False
    span = range(start, last)
    return len({episodes[f] for f in span}) == 1 and len({camera_variants[f] for f in span}) == 1
