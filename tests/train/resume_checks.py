"""Engine-agnostic checks of a killed-and-resumed run against an uninterrupted one: the same
records, and every tensor of every file in the last state slot and the exports bit for bit. The
checks read what the run folder holds, not any engine's file names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
TIMING_KEYS = ("samples_per_s", "eta_s")  # and every "*_s" key: wall-clock seconds


def small_sft(steps: int, state_every: int, val_every: int) -> dict[str, Any]:
    """An SFT section of a 2-layer width-96 model on the torch engine, states every ``state_every``
    steps and no exports: the resume / lock tests' run, short enough for CI."""
    return {
        "engine": "torch",
        "max_steps": steps,
        "state_every": state_every,
        "export_every": 100,
        "export_final": False,
        "data": {"num_workers": 0},
        "val": {"every": val_every, "num_clips": 1},
        "model": {"overrides": {"dim": 96, "ffn_dim": 256, "num_layers": 2}},
    }


def launch(
    argv: list[str], nproc: int, fault: str | None = None, timeout: float = 600, root: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node=N <argv>`` from the repo root
    (``root``: another copy of the repository, imported first)."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env.pop("GC25D_FAULT", None)
    if fault:
        env["GC25D_FAULT"] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *argv]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def records(path: Path, drop: tuple[str, ...] = TIMING_KEYS) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append({k: v for k, v in json.loads(line).items() if k not in drop and not k.endswith("_s")})
    return out


def _tensors(obj: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors(obj[k], f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{where}[{i}]")
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from _tensors(vars(obj), where)


def file_tensors(path: Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor a state or export file holds, by its path inside the file; state files load as
    the run loads them (hash checked, weights only, DeepSpeed's data classes allowed)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    from gc25d_core.checkpoint import load_torch
    from gc25d_core.train.safe_load import DEEPSPEED_STATE_CLASSES

    return dict(
        _tensors(load_torch(path, sha256, map_location="cpu", allowed=DEEPSPEED_STATE_CLASSES), path.name)
    )


def assert_same_tensors(a_dir: Path, b_dir: Path, pattern: str) -> int:
    """Both folders hold the same files matching ``pattern``, with bit-identical tensors; returns
    how many tensors were compared."""
    names_a = sorted(p.relative_to(a_dir) for p in a_dir.rglob(pattern))
    names_b = sorted(p.relative_to(b_dir) for p in b_dir.rglob(pattern))
    assert names_a == names_b and names_a, (names_a, names_b)
    digests = [
        json.loads((d / "sha256.json").read_text()) if (d / "sha256.json").is_file() else {}
        for d in (a_dir, b_dir)
    ]
    count = 0
    for name in names_a:
        key = name.as_posix()
        ta = file_tensors(a_dir / name, digests[0].get(key))
        tb = file_tensors(b_dir / name, digests[1].get(key))
        assert ta.keys() == tb.keys(), name
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and torch.equal(ta[key], tb[key]), f"{name}: {key}"
            count += 1
    return count
