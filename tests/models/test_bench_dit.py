"""bench/speed/dit.py runs every probe on the tiny model on CPU and prints JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_tiny_cpu_smoke():
    env = {**os.environ, "DIFFSYNTH_SKIP_DOWNLOAD": "True", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.speed.dit",
            "--tiny",
            "--device",
            "cpu",
            "--reps",
            "1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    seen = {(r["probe"], r.get("variant")) for r in rows}
    for key in [
        ("forward", "plain_model_fn_wan_video"),
        ("forward", "gcdit"),
        ("train", "plain_model_fn_ckpt_all"),
        ("train", "gcdit_ckpt_all"),
        ("deploy_kv_cell", "gcdit"),
        ("tf_train", "gcdit_sdpa_ckpt_all"),
    ]:
        assert key in seen, f"missing {key} in {sorted(seen, key=str)}"
    assert not [r for r in rows if "error" in r]
    diff = next(r for r in rows if r["probe"] == "forward_diff")
    assert diff["max_abs"] == 0.0  # fp32 zero-init GcDiT == model_fn_wan_video
    deploy = next(r for r in rows if r["probe"] == "deploy_kv_cell")
    assert deploy["cached_cells"] == 19 and deploy["forwards"] == 5  # sink 3 + 16 window cells cached
    train = next(r for r in rows if r.get("variant") == "gcdit_ckpt_all")
    assert train["s"] > 0 and 0 < train["mfu_vs_989"] < 1
