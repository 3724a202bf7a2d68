"""Files written through gc25d_core.atomic (exports, run state slots, checkpoint folders, configs,
hand-offs, previews) get the mode a plain ``open()`` / ``mkdir`` would give under the process umask:
0644 / 0755 under 022, owner-only under 077 (the umask is followed, never replaced)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from gc25d_core.atomic import atomic_write_text, create_exclusive, current_umask, make_tmp_dir
from gc25d_core.checkpoint import CheckpointDir
from gc25d_core.train.state import RngState, RunState

MASKS = [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]


@pytest.fixture
def restore_umask() -> Iterator[None]:
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def tree_modes(root: Path) -> dict[str, tuple[str, int]]:
    """``root`` and everything below it: relative path -> ("dir" | "file", permission bits)."""
    return {
        str(p.relative_to(root)): ("dir" if p.is_dir() else "file", mode(p))
        for p in [root, *sorted(root.rglob("*"))]
    }


def assert_modes(root: Path, file_mode: int, dir_mode: int) -> None:
    found = tree_modes(root)
    wrong = {p: (k, oct(m)) for p, (k, m) in found.items() if m != (dir_mode if k == "dir" else file_mode)}
    assert not wrong, f"expected files {file_mode:o} and folders {dir_mode:o}: {wrong}"


def test_current_umask_reads_without_changing_it(restore_umask):
    for mask in (0o022, 0o077, 0o002, 0o027):
        os.umask(mask)
        assert current_umask() == mask
        assert os.umask(mask) == mask  # still set after the read


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), MASKS)
def test_atomic_writers_follow_the_umask(tmp_path, restore_umask, mask, file_mode, dir_mode):
    os.umask(mask)
    out = tmp_path / "out"
    out.mkdir()
    atomic_write_text(out / "config.yaml", "a: 1\n")
    atomic_write_text(out / "final.json", "{}")  # a hand-off goes the same way
    assert create_exclusive(out / "claim.json", b"{}")
    tmp = make_tmp_dir(out, "slot")
    (tmp / "inside.json").write_text("{}")
    tmp.rename(out / "renamed")  # a temp folder renamed into place keeps its mode
    assert_modes(out, file_mode, dir_mode)


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), MASKS)
def test_export_and_state_slots_follow_the_umask(tmp_path, restore_umask, mask, file_mode, dir_mode):
    from gc25d_core.models.configs import tiny_config
    from gc25d_core.models.export import save_export
    from gc25d_core.models.gcdit import GcDiT

    os.umask(mask)
    run = tmp_path / "run"
    run.mkdir()
    torch.manual_seed(0)
    save_export(run / "exports" / "step-000001.safetensors", GcDiT(tiny_config()))
    # the run state: a collective save of one rank (no process group: barriers are no-ops)
    state = RunState(run / "state", slots=2)
    for step in (1, 2, 3):
        state.save(step, {"rng": RngState()}, {"stage": "sft"}, {"cursor": step})
    assert state.steps() == [2, 3]
    CheckpointDir(run / "ckpt", keep=1).save_json(7, {"step": 7})
    assert json.loads((run / "ckpt" / "step-000007" / "state.json").read_text()) == {"step": 7}
    assert_modes(run, file_mode, dir_mode)


@pytest.mark.parametrize(("mask", "file_mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_preview_video_follows_the_umask(tmp_path, restore_umask, mask, file_mode):
    from gc25d_core.preview import write_video

    os.umask(mask)
    frames = np.zeros((3, 16, 16, 3), dtype=np.uint8)
    written = write_video(tmp_path / "clip.mp4", frames)
    assert mode(written) == file_mode
