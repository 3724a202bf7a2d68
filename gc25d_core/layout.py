"""SPEC §5: the processed data layout and its atomic, validating readers and writers.

    <data_root>/index/clips.jsonl, index/runs.json
    <data_root>/latents/<clip_id>.pt          {latent bf16 [48,21,H/16,W/16], prompts [21], actions_block uint8 [21,5],
                                               clip_id, subset, scene, run, start}
    <data_root>/cond/<clip_id>.npz            ids uint8 [81,H,W]
    <data_root>/cond_ext/<clip_id>.npz        ids uint8 [28,H,W], blocks uint8 [7,5], prompts [7]
    <data_root>/cond_ext_canvas/<clip_id>.npz same keys as cond_ext
    <data_root>/meta/<clip_id>.npz            see META_SPEC
    <data_root>/text_table_gc25d.pt

Readers check keys, dtypes and shapes and name the file and key on error. ``.pt`` files are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gc25d_core.atomic import atomic_path
from gc25d_core.config import LATENT_CHANNELS, Gc25dConfig, GeometryConfig, TimelineConfig
from gc25d_core.names import InvalidNameError, check_name
from gc25d_core.vocab import invalid_values

NUM_CAPSULES = 12
CAPSULE_FLOATS = 7
# scene and run share a clip file name with "__" separators, the start and a suffix: 100 each keeps
# it under the 255-byte file-name limit
MAX_CLIP_PART_LEN = 100


class LayoutError(ValueError):
    """A processed file is missing, unreadable or has the wrong keys, dtypes or shapes."""


def _check_name(value: str, field: str) -> str:
    """A path-safe name (gc25d_core.names) that also starts alphanumeric and holds no '__', so
    ``parse_clip_id`` splits a clip id back into the same scene and run."""
    check_name(value, field, max_len=MAX_CLIP_PART_LEN)
    if not value[0].isalnum() or "__" in value:
        raise InvalidNameError(f"{field}={value!r}: must start with a letter or digit and hold no '__'")
    return value


def clip_id(scene: str, run: str, start: int) -> str:
    """SPEC: f"{scene}__{run}__{start:06d}"."""
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start={start!r}: must be a non-negative int")
    return f"{_check_name(scene, 'scene')}__{_check_name(run, 'run')}__{start:06d}"


def parse_clip_id(cid: str) -> tuple[str, str, int]:
    parts = cid.split("__")
    if len(parts) != 3 or not re.fullmatch(r"\d{6,}", parts[2]):
        raise ValueError(f"clip_id {cid!r}: expected '<scene>__<run>__<start:06d>'")
    scene, run = _check_name(parts[0], "scene"), _check_name(parts[1], "run")
    if clip_id(scene, run, int(parts[2])) != cid:
        raise ValueError(f"clip_id {cid!r}: start is not zero-padded to 6 digits")
    return scene, run, int(parts[2])


@dataclass(frozen=True)
class Layout:
    """Paths of the processed dataset under ``root``."""

    root: Path

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def clips_jsonl(self) -> Path:
        return self.index_dir / "clips.jsonl"

    @property
    def runs_json(self) -> Path:
        return self.index_dir / "runs.json"

    @property
    def text_table(self) -> Path:
        return self.root / "text_table_gc25d.pt"

    def _clip_file(self, kind: str, cid: str, suffix: str) -> Path:
        parse_clip_id(cid)  # rejects traversal and malformed ids
        return self.root / kind / f"{cid}{suffix}"

    def latents(self, cid: str) -> Path:
        return self._clip_file("latents", cid, ".pt")

    def cond(self, cid: str) -> Path:
        return self._clip_file("cond", cid, ".npz")

    def cond_ext(self, cid: str) -> Path:
        return self._clip_file("cond_ext", cid, ".npz")

    def cond_ext_canvas(self, cid: str) -> Path:
        return self._clip_file("cond_ext_canvas", cid, ".npz")

    def meta(self, cid: str) -> Path:
        return self._clip_file("meta", cid, ".npz")


@dataclass(frozen=True)
class Shapes:
    """Expected per-clip array shapes for a geometry and timeline."""

    geometry: GeometryConfig
    timeline: TimelineConfig

    @classmethod
    def of(cls, cfg: Gc25dConfig) -> Shapes:
        return cls(cfg.geometry, cfg.timeline)

    @property
    def hw(self) -> tuple[int, int]:
        return self.geometry.dst_height, self.geometry.dst_width

    @property
    def latent(self) -> tuple[int, ...]:
        return (LATENT_CHANNELS, self.timeline.num_cells, *self.geometry.latent_hw)

    @property
    def cond(self) -> tuple[int, ...]:
        return (self.timeline.num_frames, *self.hw)

    @property
    def cond_ext(self) -> tuple[int, ...]:
        return (self.timeline.num_ext_frames, *self.hw)

    def meta_frames(self, has_ext: bool) -> int:
        return self.timeline.num_frames + (self.timeline.num_ext_frames if has_ext else 0)


# --- npz ---------------------------------------------------------------------------------------


def write_npz(path: Path, arrays: dict[str, np.ndarray], compressed: bool = True) -> Path:
    """Atomic np.savez(_compressed), written through a file object (numpy then adds no suffix)."""
    members: dict[str, Any] = dict(arrays)  # numpy's stubs mistake ** members for allow_pickle
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        if compressed:
            np.savez_compressed(f, **members)
        else:
            np.savez(f, **members)
    return path


def read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise LayoutError(f"{path}: file does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise LayoutError(f"{path}: unreadable npz ({e})") from e


def _expect(path: Path, arrays: dict[str, Any], key: str, dtype: Any, shape: tuple[int, ...] | None) -> None:
    if key not in arrays:
        raise LayoutError(f"{path}: missing key {key!r}")
    a = arrays[key]
    if isinstance(a, np.ndarray):
        ok_dtype = a.dtype.kind == "U" if dtype == "U" else a.dtype == np.dtype(dtype)
        got = f"{a.dtype} {a.shape}"
    else:
        ok_dtype = isinstance(a, torch.Tensor) and a.dtype == dtype
        got = f"{getattr(a, 'dtype', type(a).__name__)} {tuple(getattr(a, 'shape', ()))}"
    if not ok_dtype or (shape is not None and tuple(a.shape) != shape):
        raise LayoutError(f"{path}: key {key!r} expected {dtype} {shape}, got {got}")


def _expect_keys(path: Path, arrays: dict[str, Any], keys: set[str]) -> None:
    if set(arrays) != keys:
        raise LayoutError(
            f"{path}: keys differ from the SPEC: missing {sorted(keys - set(arrays))}, "
            f"unexpected {sorted(set(arrays) - keys)}"
        )


def _check_parts_ids(path: Path, ids: np.ndarray) -> None:
    bad = invalid_values(ids, "parts")
    if bad:
        raise LayoutError(f"{path}: key 'ids' holds values {bad} outside the parts vocab")


def validate_cond(path: Path, arrays: dict[str, np.ndarray], shapes: Shapes) -> dict[str, np.ndarray]:
    _expect_keys(path, arrays, {"ids"})
    _expect(path, arrays, "ids", np.uint8, shapes.cond)
    _check_parts_ids(path, arrays["ids"])
    return arrays


def validate_cond_ext(path: Path, arrays: dict[str, np.ndarray], shapes: Shapes) -> dict[str, np.ndarray]:
    n = shapes.timeline.num_ext_cells
    _expect_keys(path, arrays, {"ids", "blocks", "prompts"})
    _expect(path, arrays, "ids", np.uint8, shapes.cond_ext)
    _expect(path, arrays, "blocks", np.uint8, (n, 5))
    _expect(path, arrays, "prompts", "U", (n,))
    _check_parts_ids(path, arrays["ids"])
    return arrays


META_SPEC: dict[str, tuple[Any, tuple[int, ...]]] = {
    # key: (dtype, trailing shape after F); "U" = unicode
    "world_to_clip": (np.float64, (16,)),
    "world_to_view": (np.float64, (16,)),
    "projection": (np.float64, (16,)),
    "orthographic": (np.bool_, ()),
    "fov_x_deg": (np.float32, ()),
    "ortho_width_cm": (np.float32, ()),
    "frame_offset_cm": (np.float32, (3,)),
    "capsules": (np.float32, (2, NUM_CAPSULES, CAPSULE_FLOATS)),
    "actor_pos": (np.float32, (2, 3)),
    "ground_z": (np.float32, ()),
    "player_state": ("U", ()),
    "boss_state": ("U", ()),
    "player_px": (np.int32, ()),
    "boss_px": (np.int32, ()),
}
"""SPEC §5 meta keys. ``orthographic`` is one bool per frame. ``player_px`` / ``boss_px`` are int32[F]:
the flat pixel index y·W + x at the destination size (−1 when the actor is not in view)."""


def validate_meta(
    path: Path, arrays: dict[str, np.ndarray], shapes: Shapes, has_ext: bool
) -> dict[str, np.ndarray]:
    f = shapes.meta_frames(has_ext)
    _expect_keys(path, arrays, set(META_SPEC))
    for key, (dtype, trailing) in META_SPEC.items():
        _expect(path, arrays, key, dtype, (f, *trailing))
    return arrays


def write_cond(layout: Layout, cid: str, ids: np.ndarray, shapes: Shapes) -> Path:
    path = layout.cond(cid)
    return write_npz(path, validate_cond(path, {"ids": ids}, shapes))


def read_cond(layout: Layout, cid: str, shapes: Shapes) -> np.ndarray:
    path = layout.cond(cid)
    return validate_cond(path, read_npz(path), shapes)["ids"]


def write_cond_ext(path: Path, arrays: dict[str, np.ndarray], shapes: Shapes) -> Path:
    arrays = {**arrays, "prompts": np.asarray(arrays["prompts"], dtype=str)}
    return write_npz(path, validate_cond_ext(path, arrays, shapes))


def read_cond_ext(path: Path, shapes: Shapes) -> dict[str, np.ndarray]:
    return validate_cond_ext(path, read_npz(path), shapes)


def write_meta(
    layout: Layout, cid: str, arrays: dict[str, np.ndarray], shapes: Shapes, has_ext: bool
) -> Path:
    path = layout.meta(cid)
    return write_npz(path, validate_meta(path, arrays, shapes, has_ext))


def read_meta(layout: Layout, cid: str, shapes: Shapes, has_ext: bool) -> dict[str, np.ndarray]:
    path = layout.meta(cid)
    return validate_meta(path, read_npz(path), shapes, has_ext)


# --- latents .pt -------------------------------------------------------------------------------

LATENT_KEYS = {"latent", "prompts", "actions_block", "clip_id", "subset", "scene", "run", "start"}


def validate_latents(path: Path, obj: Any, shapes: Shapes) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise LayoutError(f"{path}: expected a dict, got {type(obj).__name__}")
    _expect_keys(path, obj, LATENT_KEYS)
    _expect(path, obj, "latent", torch.bfloat16, shapes.latent)
    _expect(path, obj, "actions_block", torch.uint8, (shapes.timeline.num_cells, 5))
    prompts = obj["prompts"]
    if not (
        isinstance(prompts, list)
        and len(prompts) == shapes.timeline.num_cells
        and all(isinstance(p, str) for p in prompts)
    ):
        raise LayoutError(f"{path}: key 'prompts' must be a list of {shapes.timeline.num_cells} str")
    for key in ("clip_id", "subset", "scene", "run"):
        if not isinstance(obj[key], str):
            raise LayoutError(f"{path}: key {key!r} must be str, got {type(obj[key]).__name__}")
    if not isinstance(obj["start"], int):
        raise LayoutError(f"{path}: key 'start' must be int")
    if clip_id(obj["scene"], obj["run"], obj["start"]) != obj["clip_id"]:
        raise LayoutError(f"{path}: key 'clip_id'={obj['clip_id']!r} disagrees with scene/run/start")
    return obj


def write_latents(layout: Layout, record: dict[str, Any], shapes: Shapes) -> Path:
    path = layout.latents(record["clip_id"])
    validate_latents(path, record, shapes)
    with atomic_path(path) as tmp:
        torch.save(record, tmp)
    return path


def read_latents(path: Path, shapes: Shapes) -> dict[str, Any]:
    if not path.is_file():
        raise LayoutError(f"{path}: file does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt archives
        raise LayoutError(f"{path}: unreadable .pt ({e})") from e
    return validate_latents(path, obj, shapes)


def npz_headers(path: Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
    """Each member's (dtype, shape) read from the .npy headers only (no decompression of the data);
    None when the file is missing or unreadable. Writes are atomic, so a present file is whole."""
    try:
        with zipfile.ZipFile(path) as zf:
            out = {}
            for name in zf.namelist():
                with zf.open(name) as f:
                    major, _minor = np.lib.format.read_magic(f)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if major == 1
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read_header(f)
                out[name.removesuffix(".npy")] = (dtype, tuple(shape))
            return out
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        return None


def npz_matches(path: Path, expected: dict[str, tuple[Any, tuple[int, ...]]]) -> bool:
    """True when the npz holds exactly ``expected`` keys with those dtypes ("U" = any unicode) and shapes."""
    headers = npz_headers(path)
    if headers is None or set(headers) != set(expected):
        return False
    for key, (dtype, shape) in expected.items():
        got_dtype, got_shape = headers[key]
        ok = got_dtype.kind == "U" if dtype == "U" else got_dtype == np.dtype(dtype)
        if not ok or got_shape != tuple(shape):
            return False
    return True


def cond_expected(shapes: Shapes) -> dict[str, tuple[Any, tuple[int, ...]]]:
    return {"ids": (np.uint8, shapes.cond)}


def cond_ext_expected(shapes: Shapes) -> dict[str, tuple[Any, tuple[int, ...]]]:
    n = shapes.timeline.num_ext_cells
    return {"ids": (np.uint8, shapes.cond_ext), "blocks": (np.uint8, (n, 5)), "prompts": ("U", (n,))}


def meta_expected(shapes: Shapes, has_ext: bool) -> dict[str, tuple[Any, tuple[int, ...]]]:
    f = shapes.meta_frames(has_ext)
    return {k: (dtype, (f, *trailing)) for k, (dtype, trailing) in META_SPEC.items()}
