"""The raw dataset layout (GameCrafter-Data-v10 shape), as one pydantic schema, and its reader.

    <raw_root>/
      index/clips_81.json                 ClipsIndexFile: every 81-frame clip (start ∈ 96ℤ, end exclusive)
      <subset>/<scene>/<run>/
        run.json                          RunInfo
        frames.jsonl                      one FrameRecord per frame, frame = 0..num_frames-1 in order
        actions_block_0.25s.npy           uint8 [num_blocks, 5]; block b covers frames 4b..4b+3
        frames/<frame:06d>/rgb.png        RGB, src_width × src_height
        frames/<frame:06d>/ids.png        uint8 grayscale UE labels (0..6 static, 10 player, 11 boss, 255)
        frames/<frame:06d>/frame.json     FrameJson (cameras, capsules, actor state)

Conventions of FrameJson: world units are cm, z is up. Matrices are 4×4 row-major, flattened to 16,
applied to column vectors: clip = world_to_clip @ [x, y, z, 1]. NDC x right, y up; source pixel
x = (ndc_x + 1)/2 · W − 0.5, y = (1 − ndc_y)/2 · H − 0.5 (pixel centres at integers).

``RawSource`` validates what it reads and names the path and field on error.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SUBSETS = ("v10_real", "v9_stylized")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RawLayoutError(ValueError):
    """A raw file is missing or malformed; the message names the path and the field."""


class _Model(BaseModel):
    # allow_inf_nan=False: a NaN/Inf anywhere in a raw file (cameras, capsules, positions) is an error
    # at the reader, before it can reach meta/*.npz or the ray casting
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _safe_name(v: str) -> str:
    if not _NAME.match(v) or "__" in v or ".." in v:
        raise ValueError(f"{v!r} is not a safe name ([A-Za-z0-9._-], no '__' or '..')")
    return v


class ClipEntry(_Model):
    subset: Literal["v10_real", "v9_stylized"]
    scene: str
    run: str
    start: int = Field(ge=0)
    end: int

    _names = field_validator("scene", "run")(_safe_name)


class ClipsIndexFile(_Model):
    clips: list[ClipEntry]


class RunInfo(_Model):
    subset: Literal["v10_real", "v9_stylized"]
    scene: str
    run: str
    num_frames: int = Field(ge=1)
    fps: int = 16
    width: int
    height: int
    framed: bool = Field(description="P9 'framed' runs: the camera drifts, the player is not kept centred")

    _names = field_validator("scene", "run")(_safe_name)


class FrameRecord(_Model):
    """One row of frames.jsonl."""

    frame: int = Field(ge=0)
    episode: int
    camera_variant: str
    look_name: str
    orthographic: bool
    centered: bool
    dead: bool = False
    event: str | None = None


Vec3 = tuple[float, float, float]
Capsule = tuple[float, float, float, float, float, float, float]
Matrix16 = Annotated[list[float], Field(min_length=16, max_length=16)]
"""A 4×4 matrix, row-major, flattened to 16 floats."""


def _rank(rows: np.ndarray) -> int:
    """Numerical rank (SVD, tolerance relative to the largest singular value: units are cm)."""
    return int(np.linalg.matrix_rank(rows))


def _projects_pixels(v: list[float]) -> list[float]:
    """Rows x, y and w must be independent: a pixel's ray is where ndc_x·w = x and ndc_y·w = y meet,
    which needs all three (an all-zero or collapsed matrix maps no pixel to a ray). Row z is not
    required: depth encodings differ (reversed or infinite far plane)."""
    rows = np.asarray(v, dtype=np.float64).reshape(4, 4)[[0, 1, 3]]
    if _rank(rows) < 3:
        raise ValueError("degenerate: rows x, y, w of the 4x4 matrix are not linearly independent")
    return v


def _invertible(v: list[float]) -> list[float]:
    """A world-to-view transform is rigid, so it has an inverse; a singular one is corrupt."""
    if _rank(np.asarray(v, dtype=np.float64).reshape(4, 4)) < 4:
        raise ValueError("degenerate: the 4x4 matrix is singular (a rigid view transform is invertible)")
    return v


class FrameJson(_Model):
    """frames/<frame>/frame.json: everything meta needs for one frame."""

    frame: int = Field(ge=0)
    episode: int
    camera_variant: str
    look_name: str
    world_to_clip: Matrix16
    world_to_view: Matrix16
    projection: Matrix16
    orthographic: bool
    fov_x_deg: float
    ortho_width_cm: float
    frame_offset_cm: Vec3
    capsules: dict[Literal["player", "boss"], list[Capsule]]
    actor_pos: dict[Literal["player", "boss"], Vec3]
    player_state: str
    boss_state: str

    _project = field_validator("world_to_clip", "projection")(_projects_pixels)
    _view = field_validator("world_to_view")(_invertible)

    @field_validator("capsules")
    @classmethod
    def _twelve(cls, v: dict[str, list[Capsule]]) -> dict[str, list[Capsule]]:
        for actor in ("player", "boss"):
            if actor not in v or len(v[actor]) != 12:
                raise ValueError(f"capsules[{actor!r}] must hold 12 capsules of 7 floats")
        return v


def _validation_message(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        # a scalar input says what was wrong (nan, inf, a bad name); a whole object would only be noise
        shown = f" (got {got!r})" if isinstance(got, int | float | str) and len(repr(got)) <= 80 else ""
        parts.append(f"{loc}: {e['msg']}{shown}")
    return f"{path}: " + "; ".join(parts)


def read_model(path: Path, model: type[_Model], line: int | None = None, text: str | None = None):
    where = f"{path}:{line}" if line is not None else str(path)
    try:
        raw = path.read_text(encoding="utf-8") if text is None else text
    except FileNotFoundError:
        raise RawLayoutError(f"{path}: file does not exist") from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise RawLayoutError(_validation_message(Path(where), e)) from None


class RunDir:
    """One run folder of the raw layout."""

    def __init__(self, root: Path, subset: str, scene: str, run: str):
        self.path = root / _safe_name(subset) / _safe_name(scene) / _safe_name(run)
        self.subset, self.scene, self.run = subset, scene, run

    @cached_property
    def info(self) -> RunInfo:
        info = read_model(self.path / "run.json", RunInfo)
        if (info.subset, info.scene, info.run) != (self.subset, self.scene, self.run):
            raise RawLayoutError(f"{self.path / 'run.json'}: subset/scene/run disagree with the folder")
        return info

    @cached_property
    def frames(self) -> list[FrameRecord]:
        path = self.path / "frames.jsonl"
        if not path.is_file():
            raise RawLayoutError(f"{path}: file does not exist")
        records: list[FrameRecord] = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            rec = read_model(path, FrameRecord, line=i, text=line)
            if rec.frame != len(records):
                raise RawLayoutError(f"{path}:{i}: field 'frame'={rec.frame}, expected {len(records)}")
            records.append(rec)
        if len(records) != self.info.num_frames:
            raise RawLayoutError(f"{path}: {len(records)} rows, run.json num_frames={self.info.num_frames}")
        return records

    @cached_property
    def actions_block(self) -> np.ndarray:
        path = self.path / "actions_block_0.25s.npy"
        try:
            arr = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise RawLayoutError(f"{path}: file does not exist") from None
        except ValueError as e:
            raise RawLayoutError(f"{path}: unreadable npy ({e})") from None
        if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != 5:
            raise RawLayoutError(f"{path}: expected uint8 [N,5], got {arr.dtype} {arr.shape}")
        return arr

    def frame_dir(self, frame: int) -> Path:
        return self.path / "frames" / f"{frame:06d}"


class RawSource:
    """Reader of one raw dataset snapshot in the layout above."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        if not self.root.is_dir():
            raise RawLayoutError(f"{self.root}: raw dataset folder does not exist")

    @property
    def clips_index_path(self) -> Path:
        return self.root / "index" / "clips_81.json"

    @cached_property
    def clips(self) -> list[ClipEntry]:
        return list(read_model(self.clips_index_path, ClipsIndexFile).clips)

    def run(self, subset: str, scene: str, run: str) -> RunDir:
        return RunDir(self.root, subset, scene, run)

    def runs(self) -> list[RunDir]:
        """Runs referenced by the clips index, in first-seen order."""
        seen: dict[tuple[str, str, str], RunDir] = {}
        for c in self.clips:
            key = (c.subset, c.scene, c.run)
            if key not in seen:
                seen[key] = self.run(*key)
        return list(seen.values())
