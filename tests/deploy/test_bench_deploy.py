"""bench/speed/deploy.py runs every CPU lever on the tiny models and prints one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_deploy_cpu_tiny_prints_one_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "bench.speed.deploy", "--device", "cpu", "--dims", "tiny"]
    cmd += ["--cells", "2", "--parts", "1", "--warmup", "0", "--levers", "fold", "--world-cells", "1"]
    proc = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "DIFFSYNTH_SKIP_DOWNLOAD": "True",
            "HF_HUB_OFFLINE": "1",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r == json.loads(out.read_text())
    assert set(r["levers"]) == {"exact", "fold"}
    exact, fold = r["levers"]["exact"], r["levers"]["fold"]
    assert exact["forwards_per_cell"] == 5 and fold["forwards_per_cell"] == 4
    assert exact["cached_cells"] == 19  # a full window: sink 3 + 16
    assert fold["vs_exact"]["rel"] < 1e-4
    for lever in (exact, fold):
        assert lever["e2e_s_per_cell"]["n"] == 2 and lever["e2e_fps"] > 0 and lever["denoise_only_fps"] > 0
        assert set(lever["parts_s"]) == {"denoise", "commit", "decode", "host", "total"}
        assert lever["first_frame_s"] > 0
    assert r["world"]["s_per_cell"]["n"] == 1
    assert r["summary"]["best_lever"] in {"exact", "fold"}
