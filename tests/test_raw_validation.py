"""Issue 14 defect 4: a non-finite or degenerate camera in a frame.json is rejected by the raw reader,
by the raw validation step and by the meta builder, with the file and the field in the message.

The dataset is a real code-world run (81 frames, one clip) written by the generator; each case
corrupts one value of one frame's frame.json the way a JSON writer emits it (NaN, Infinity).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gc25d_core.capsules import as_matrix
from gc25d_core.codeworld import get_preset
from gc25d_core.codeworld.writer import clips_index, write_run
from gc25d_core.config import Gc25dConfig
from gc25d_core.preprocess.clips import build_meta
from gc25d_core.raw_frames import read_frame_json
from gc25d_core.raw_layout import RawLayoutError, RawSource, RunDir
from gc25d_core.raw_prepare import validate_raw

BAD_FRAME = 5
NON_FINITE = {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf}
# (field path as the error names it, path into the frame.json object)
NUMERIC_FIELDS: list[tuple[str, tuple[Any, ...]]] = [
    ("world_to_clip.3", ("world_to_clip", 3)),
    ("world_to_view.14", ("world_to_view", 14)),
    ("projection.0", ("projection", 0)),
    ("fov_x_deg", ("fov_x_deg",)),
    ("ortho_width_cm", ("ortho_width_cm",)),
    ("frame_offset_cm.1", ("frame_offset_cm", 1)),
    ("actor_pos.player.2", ("actor_pos", "player", 2)),
    ("actor_pos.boss.0", ("actor_pos", "boss", 0)),
    ("capsules.player.3.6", ("capsules", "player", 3, 6)),
    ("capsules.boss.11.0", ("capsules", "boss", 11, 0)),
]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated raw dataset: one code-world run of 81 frames and its clips index."""
    spec = next(s for s in get_preset("tiny").runs(0) if s.run == "R10_s1512")
    spec = dataclasses.replace(spec, num_frames=81)
    root = tmp_path_factory.mktemp("raw_validation") / "raw"
    write_run(root, spec, get_preset("tiny").geometry)
    (root / "index").mkdir()
    (root / "index" / "clips_81.json").write_text(clips_index([spec]).model_dump_json())
    return root


@pytest.fixture
def raw(generated: Path, tiny_cfg: Gc25dConfig) -> Path:
    """A fresh copy of the generated dataset at the tiny config's raw root (tests corrupt it)."""
    root = Path(tiny_cfg.raw.root)
    shutil.copytree(generated, root)
    return root


def _run(root: Path) -> RunDir:
    (run,) = RawSource(root).runs()
    return run


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def _corrupt(root: Path, path: tuple[Any, ...], value: Any) -> Path:
    frame_json = _run(root).frame_dir(BAD_FRAME) / "frame.json"
    data = json.loads(frame_json.read_text())
    _set(data, path, value)
    frame_json.write_text(json.dumps(data))  # json writes NaN / Infinity / -Infinity literals
    return frame_json


def _assert_rejected(root: Path, cfg: Gc25dConfig, frame_json: Path, field: str) -> None:
    """The reader, the raw validation and the meta builder all refuse it, naming file and field."""
    where = re.escape(str(frame_json)) + ": " + re.escape(field) + r"\b"
    with pytest.raises(RawLayoutError, match=where):
        read_frame_json(_run(root), BAD_FRAME)
    with pytest.raises(RawLayoutError, match=where):
        validate_raw(cfg, log=lambda _: None)
    with pytest.raises(RawLayoutError, match=where):
        build_meta(_run(root), 0, False, cfg)


def test_good_generated_data_passes(raw: Path, tiny_cfg: Gc25dConfig):
    summary = validate_raw(tiny_cfg, log=lambda _: None)
    assert (summary["num_runs"], summary["num_clips"], summary["num_frames"]) == (1, 1, 81)
    meta = build_meta(_run(raw), 0, False, tiny_cfg)
    assert meta["world_to_clip"].shape == (81, 16)


@pytest.mark.parametrize("kind", sorted(NON_FINITE))
@pytest.mark.parametrize(("field", "path"), NUMERIC_FIELDS, ids=[f for f, _ in NUMERIC_FIELDS])
def test_non_finite_value_is_rejected(raw: Path, tiny_cfg: Gc25dConfig, field, path, kind):
    frame_json = _corrupt(raw, path, NON_FINITE[kind])
    _assert_rejected(raw, tiny_cfg, frame_json, field)
    with pytest.raises(RawLayoutError, match="finite number"):
        read_frame_json(_run(raw), BAD_FRAME)


@pytest.mark.parametrize("field", ["world_to_clip", "projection", "world_to_view"])
def test_all_zero_matrix_is_rejected(raw: Path, tiny_cfg: Gc25dConfig, field):
    frame_json = _corrupt(raw, (field,), [0.0] * 16)
    _assert_rejected(raw, tiny_cfg, frame_json, field)
    with pytest.raises(RawLayoutError, match="degenerate"):
        read_frame_json(_run(raw), BAD_FRAME)


def test_collapsed_world_to_clip_is_rejected(raw: Path, tiny_cfg: Gc25dConfig):
    """Row y equal to row x: every pixel of a row would share one ray."""
    m = json.loads((_run(raw).frame_dir(BAD_FRAME) / "frame.json").read_text())["world_to_clip"]
    frame_json = _corrupt(raw, ("world_to_clip",), m[:4] * 2 + m[8:])
    _assert_rejected(raw, tiny_cfg, frame_json, "world_to_clip")


@pytest.mark.parametrize(
    "matrix",
    [[1.0] * 15, [1.0] * 17, [[1.0, 0.0, 0.0, 0.0]] * 4, "identity"],
    ids=["15_floats", "17_floats", "nested_4x4", "a_string"],
)
def test_wrong_shaped_world_to_clip_is_rejected(raw: Path, tiny_cfg: Gc25dConfig, matrix):
    frame_json = _corrupt(raw, ("world_to_clip",), matrix)
    _assert_rejected(raw, tiny_cfg, frame_json, "world_to_clip")


def test_matrix_errors_say_what_is_wrong():
    """A 4x4 with a NaN is reported as non-finite (where), not as a wrong shape."""
    m = np.eye(4)
    m[2, 1] = math.nan
    with pytest.raises(ValueError, match=r"world_to_clip: 1 non-finite values, first \[2,1\] = nan"):
        as_matrix(m.ravel().tolist(), "world_to_clip")
    with pytest.raises(ValueError, match=r"world_to_clip: expected 16 floats .* got shape \[15\]"):
        as_matrix([1.0] * 15, "world_to_clip")
