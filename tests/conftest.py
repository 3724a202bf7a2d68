"""Shared fixtures: the tiny preset in a tmp folder and an index-level raw dataset builder."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gc25d_core.config import Gc25dConfig, load_config

os.environ.setdefault("DIFFSYNTH_SKIP_DOWNLOAD", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    """Each test process settles MKL's vector-maths dispatch on one thread before a test runs those
    ops on several (gc25d_core.numerics.resolve_vml_dispatch), as every job's process does."""
    from gc25d_core.numerics import resolve_vml_dispatch

    resolve_vml_dispatch()


@pytest.fixture
def tiny_cfg(tmp_path: Path) -> Gc25dConfig:
    """The tiny preset with every path under tmp_path."""
    return load_config(
        "tiny",
        {
            "paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path / "runs")},
            "raw": {"root": str(tmp_path / "raw")},
        },
    )


@dataclass
class RunSpec:
    """A raw run described by per-frame episode / camera_variant / look_name segments."""

    run: str
    subset: str = "v10_real"
    scene: str = "arena"
    num_frames: int = 300
    episode_changes: dict[int, int] = field(default_factory=dict)  # frame -> new episode
    camera_changes: dict[int, str] = field(default_factory=dict)  # frame -> new camera_variant
    look_changes: dict[int, str] = field(default_factory=dict)  # frame -> new look
    dead_frames: set[int] = field(default_factory=set)
    event_frames: set[int] = field(default_factory=set)
    ortho_frames: set[int] = field(default_factory=set)
    framed: bool = False
    num_blocks: int | None = None


def write_index_raw(
    root: Path, runs: list[RunSpec], stride: int = 96, width: int = 200, height: int = 96
) -> Path:
    """Write the index-level part of the raw layout (run.json, frames.jsonl, actions, clips_81.json,
    empty frame folders) — enough for the clips index and raw validation."""
    clips = []
    for spec in runs:
        run_dir = root / spec.subset / spec.scene / spec.run
        run_dir.mkdir(parents=True, exist_ok=True)
        info = {
            "subset": spec.subset,
            "scene": spec.scene,
            "run": spec.run,
            "num_frames": spec.num_frames,
            "fps": 16,
            "width": width,
            "height": height,
            "framed": spec.framed,
        }
        (run_dir / "run.json").write_text(json.dumps(info))
        episode, camera, look = 0, "cam_a", "look_0"
        rows = []
        for f in range(spec.num_frames):
            episode = spec.episode_changes.get(f, episode)
            camera = spec.camera_changes.get(f, camera)
            look = spec.look_changes.get(f, look)
            rows.append(
                json.dumps(
                    {
                        "frame": f,
                        "episode": episode,
                        "camera_variant": camera,
                        "look_name": look,
                        "orthographic": f in spec.ortho_frames,
                        "centered": not spec.framed,
                        "dead": f in spec.dead_frames,
                        "event": "hit" if f in spec.event_frames else None,
                    }
                )
            )
        (run_dir / "frames.jsonl").write_text("\n".join(rows) + "\n")
        n_blocks = spec.num_blocks if spec.num_blocks is not None else (spec.num_frames + 3) // 4
        rng = np.random.default_rng(len(spec.run))
        blocks = np.zeros((n_blocks, 5), np.uint8)
        blocks[:, 0] = rng.integers(0, 9, n_blocks)
        np.save(run_dir / "actions_block_0.25s.npy", blocks)
        for f in range(spec.num_frames):
            (run_dir / "frames" / f"{f:06d}").mkdir(parents=True, exist_ok=True)
        for start in range(0, spec.num_frames - 81 + 1, stride):
            clips.append(
                {
                    "subset": spec.subset,
                    "scene": spec.scene,
                    "run": spec.run,
                    "start": start,
                    "end": start + 81,
                }
            )
    (root / "index").mkdir(parents=True, exist_ok=True)
    (root / "index" / "clips_81.json").write_text(json.dumps({"clips": clips}))
    return root


# Session worlds: defined here once, so that every module shares one build (a fixture imported into
# several test modules is a separate fixture in each, built again).
from tests.canvas_fixtures import MiniWorld, build_mini_world  # noqa: E402
from tests.codeworld_fixtures import TinyRaw, generate_tiny_raw  # noqa: E402


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> TinyRaw:
    """The code world's tiny dataset (tests/codeworld_fixtures.py)."""
    return generate_tiny_raw(tmp_path_factory.mktemp("codeworld") / "raw")


@pytest.fixture(scope="session")
def mini_world(tmp_path_factory: pytest.TempPathFactory) -> MiniWorld:
    """One code-world run with cond, meta and cond_ext built (tests/canvas_fixtures.py)."""
    return build_mini_world(tmp_path_factory.mktemp("mini_world"))


@pytest.fixture
def one_thread():
    """Multi-threaded CPU kernels are not bitwise reproducible run to run (torchrun sets 1 thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
