"""torchrun launches of the benches that go through the real entry points (SFT bench, learning signal)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_env() -> dict[str, str]:
    """This environment, with DeepSpeed's compiled ops cached in the repo (built once per machine)."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    return env


def torchrun(nproc: int, args: list[str], log: Path, env: dict[str, str]) -> tuple[int, float]:
    """``python -m torch.distributed.run --standalone`` with ``args`` from the repo root, all output
    into ``log``; (exit code, wall seconds)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t0
