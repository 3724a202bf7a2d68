"""Per-clip builders of SPEC §5: cond, cond_ext and meta, from one raw run.

cond      ids uint8 [81,H,W]: resample_ids(ids.png) → label_parts(...) ⊆ valid_raw_ids("parts")
cond_ext  ids uint8 [28,H,W] for frames s+81..s+108, blocks uint8 [7,5], prompts [7]
meta      per-frame cameras, capsules and actor state, F = 81 (+28 when has_ext)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gc25d_core.capsules import capsules_from_json, label_parts, project_points
from gc25d_core.config import Gc25dConfig
from gc25d_core.geometry import resample_ids
from gc25d_core.raw_frames import read_frame_json, read_ids
from gc25d_core.raw_layout import FrameJson, RunDir
from gc25d_core.text import block_to_prompt, text_data
from gc25d_core.timeline import ext_blocks, extension_frames

PLAYER, BOSS = 0, 1


def cond_frame(run: RunDir, frame: int, cfg: Gc25dConfig, fj: FrameJson | None = None) -> np.ndarray:
    """One frame's condition: uint8 [H,W] parts raw ids."""
    fj = fj or read_frame_json(run, frame)
    ids = resample_ids(read_ids(run, frame), cfg.geometry)
    return label_parts(ids, fj.world_to_clip, fj.world_to_view, fj, cfg.geometry)


def cond_frames(run: RunDir, frames: Sequence[int], cfg: Gc25dConfig) -> np.ndarray:
    out = np.empty((len(frames), cfg.geometry.dst_height, cfg.geometry.dst_width), np.uint8)
    for i, f in enumerate(frames):
        out[i] = cond_frame(run, f, cfg)
    return out


def build_cond(run: RunDir, start: int, cfg: Gc25dConfig) -> np.ndarray:
    return cond_frames(run, range(start, start + cfg.timeline.num_frames), cfg)


def ext_block_prompts(run: RunDir, start: int, cfg: Gc25dConfig) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [7,5], prompts [7]) of the clip's extension cells, from the run's actions."""
    blocks = ext_blocks(run.actions_block, start, cfg.timeline)
    data = text_data(cfg.text)
    return blocks, np.asarray([block_to_prompt(b, data) for b in blocks], dtype=str)


def build_cond_ext(run: RunDir, start: int, cfg: Gc25dConfig) -> dict[str, np.ndarray]:
    blocks, prompts = ext_block_prompts(run, start, cfg)
    return {
        "ids": cond_frames(run, extension_frames(start, cfg.timeline), cfg),
        "blocks": blocks,
        "prompts": prompts,
    }


def ground_z(capsules_player: np.ndarray) -> float:
    """min over the player's capsule endpoints of z minus radius (cm). capsules [12,7] = a xyz, b xyz, r."""
    c = np.asarray(capsules_player, dtype=np.float64)
    return float(np.min(np.minimum(c[:, 2], c[:, 5]) - c[:, 6]))


def actor_pixel(pos: Sequence[float], world_to_clip: Sequence[float], cfg: Gc25dConfig) -> int:
    """Flat destination pixel index y·W + x of a world point, −1 when behind the camera or off-frame."""
    xy, in_front = project_points(np.asarray(pos, dtype=np.float64), world_to_clip, cfg.geometry)
    x, y = np.floor(xy + 0.5).astype(np.int64)
    w, h = cfg.geometry.dst_width, cfg.geometry.dst_height
    if not bool(in_front) or not (0 <= x < w and 0 <= y < h):
        return -1
    return int(y * w + x)


def build_meta(run: RunDir, start: int, has_ext: bool, cfg: Gc25dConfig) -> dict[str, np.ndarray]:
    n = cfg.timeline.num_frames + (cfg.timeline.num_ext_frames if has_ext else 0)
    fjs = [read_frame_json(run, f) for f in range(start, start + n)]
    caps = np.stack([capsules_from_json(fj) for fj in fjs]).astype(np.float32)  # [F,2,12,7]
    pos = np.array([[fj.actor_pos["player"], fj.actor_pos["boss"]] for fj in fjs], np.float32)
    return {
        "world_to_clip": np.array([fj.world_to_clip for fj in fjs], np.float64),
        "world_to_view": np.array([fj.world_to_view for fj in fjs], np.float64),
        "projection": np.array([fj.projection for fj in fjs], np.float64),
        "orthographic": np.array([fj.orthographic for fj in fjs], np.bool_),
        "fov_x_deg": np.array([fj.fov_x_deg for fj in fjs], np.float32),
        "ortho_width_cm": np.array([fj.ortho_width_cm for fj in fjs], np.float32),
        "frame_offset_cm": np.array([fj.frame_offset_cm for fj in fjs], np.float32),
        "capsules": caps,
        "actor_pos": pos,
        "ground_z": np.array([ground_z(c[PLAYER]) for c in caps], np.float32),
        "player_state": np.array([fj.player_state for fj in fjs], dtype=str),
        "boss_state": np.array([fj.boss_state for fj in fjs], dtype=str),
        "player_px": np.array(
            [actor_pixel(fj.actor_pos["player"], fj.world_to_clip, cfg) for fj in fjs], np.int32
        ),
        "boss_px": np.array(
            [actor_pixel(fj.actor_pos["boss"], fj.world_to_clip, cfg) for fj in fjs], np.int32
        ),
    }
