"""Per-frame readers of the raw layout (raw_layout.py): rgb.png, ids.png and frame.json of a run.

Every reader validates what it returns and raises ``RawLayoutError`` naming the file and the field:
a missing file, an undecodable PNG, a size that disagrees with run.json (field width/height), ids
values outside the UE label set (field values), or a frame.json whose fields fail the FrameJson
schema (a non-finite number anywhere, a degenerate matrix) or disagree with frames.jsonl (fields
frame / episode / camera_variant / look_name / orthographic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from gc25d_core.raw_layout import FrameJson, RawLayoutError, RawSource, RunDir, read_model
from gc25d_core.vocab import BOSS_CORE, PLAYER_CORE, STATIC_IDS, UNKNOWN

UE_LABEL_IDS: tuple[int, ...] = tuple(sorted({*STATIC_IDS, PLAYER_CORE, BOSS_CORE, UNKNOWN}))
"""Values ids.png may hold: static 0..6, player 10, boss 11, UNKNOWN 255."""
_UE_LUT = np.zeros(256, bool)
_UE_LUT[list(UE_LABEL_IDS)] = True


def _read_png(path: Path, flags: int) -> np.ndarray:
    if not path.is_file():
        raise RawLayoutError(f"{path}: file does not exist")
    data = np.fromfile(path, dtype=np.uint8)
    img = cv2.imdecode(data, flags) if len(data) else None
    if img is None:
        raise RawLayoutError(f"{path}: not a decodable PNG")
    return img


def _check_size(path: Path, img: np.ndarray, run: RunDir) -> None:
    h, w = img.shape[:2]
    info = run.info
    if (w, h) != (info.width, info.height):
        raise RawLayoutError(f"{path}: fields width/height={w}x{h}, run.json says {info.width}x{info.height}")


def _check_frame(run: RunDir, frame: int) -> None:
    n = run.info.num_frames
    if not 0 <= frame < n:
        raise RawLayoutError(f"{run.path / 'run.json'}: field frame={frame} outside 0..{n - 1}")


def read_rgb(run: RunDir, frame: int) -> np.ndarray:
    """frames/<frame>/rgb.png → RGB uint8 [H,W,3] (H, W = run.json height, width)."""
    _check_frame(run, frame)
    path = run.frame_dir(frame) / "rgb.png"
    img = _read_png(path, cv2.IMREAD_UNCHANGED)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] not in (3, 4):
        raise RawLayoutError(f"{path}: field channels: expected 8-bit RGB, got {img.dtype} shape {img.shape}")
    _check_size(path, img, run)
    return np.ascontiguousarray(img[..., 2::-1])


def read_ids(run: RunDir, frame: int) -> np.ndarray:
    """frames/<frame>/ids.png → uint8 [H,W] UE labels (values ⊆ UE_LABEL_IDS)."""
    _check_frame(run, frame)
    path = run.frame_dir(frame) / "ids.png"
    img = _read_png(path, cv2.IMREAD_UNCHANGED)
    if img.dtype != np.uint8 or img.ndim != 2:
        raise RawLayoutError(
            f"{path}: field channels: expected 8-bit grayscale, got {img.dtype} shape {img.shape}"
        )
    _check_size(path, img, run)
    present = np.flatnonzero(np.bincount(img.ravel(), minlength=256))
    bad = [int(v) for v in present if not _UE_LUT[v]]
    if bad:
        raise RawLayoutError(f"{path}: field values {bad} are not UE labels {list(UE_LABEL_IDS)}")
    return img


def read_frame_json(run: RunDir, frame: int, check_record: bool = True) -> FrameJson:
    """frames/<frame>/frame.json → FrameJson; with ``check_record`` its frame, episode,
    camera_variant and look_name must agree with row ``frame`` of frames.jsonl."""
    _check_frame(run, frame)
    path = run.frame_dir(frame) / "frame.json"
    fj: FrameJson = read_model(path, FrameJson)
    if fj.frame != frame:
        raise RawLayoutError(f"{path}: field frame={fj.frame}, expected {frame}")
    if check_record:
        rec = run.frames[frame]
        for field in ("episode", "camera_variant", "look_name", "orthographic"):
            if getattr(fj, field) != getattr(rec, field):
                raise RawLayoutError(
                    f"{path}: field {field}={getattr(fj, field)!r} disagrees with "
                    f"{run.path / 'frames.jsonl'} ({getattr(rec, field)!r})"
                )
    return fj


def read_frame(run: RunDir, frame: int) -> tuple[np.ndarray, np.ndarray, FrameJson]:
    """(rgb uint8 [H,W,3], ids uint8 [H,W], FrameJson) of one frame."""
    return read_rgb(run, frame), read_ids(run, frame), read_frame_json(run, frame)


def validate_frames(source: RawSource, every: int = 1) -> dict[str, Any]:
    """Read and validate every ``every``-th frame (and each run's last) of every run in the index.
    Returns {runs, frames_checked}; raises RawLayoutError on the first bad file."""
    checked = 0
    runs = source.runs()
    for run in runs:
        n = run.info.num_frames
        if len(run.actions_block) < -(-n // 4):
            raise RawLayoutError(
                f"{run.path / 'actions_block_0.25s.npy'}: field shape: {len(run.actions_block)} blocks "
                f"for {n} frames (need {-(-n // 4)})"
            )
        for f in sorted({*range(0, n, max(1, every)), n - 1}):
            read_frame(run, f)
            checked += 1
    return {"runs": len(runs), "frames_checked": checked}
