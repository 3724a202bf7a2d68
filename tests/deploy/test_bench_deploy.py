"""bench/speed/deploy.py on the tiny models prints one JSON object: the live loop (the default), the
steady-state cell, and action-to-photon through the play server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "bench.speed.deploy", "--device", "cpu", "--dims", "tiny", *args]
    proc = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
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
    return r


def test_bench_deploy_steady_cpu_tiny_prints_one_json(tmp_path):
    r = _run(
        tmp_path,
        "--mode",
        "steady",
        "--cells",
        "2",
        "--parts",
        "1",
        "--warmup",
        "0",
        "--levers",
        "fold",
        "--world-cells",
        "1",
    )
    assert r["mode"] == "steady"
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


def test_bench_deploy_loop_cpu_tiny_times_every_cell_and_checks_the_world(tmp_path):
    r = _run(
        tmp_path,
        "--cells",
        "3",
        "--parts",
        "2",
        "--levers",
        "fold,defer",
        "--world-check",
        "2",
        "--world-numpy-cells",
        "1",
    )
    assert r["mode"] == "loop" and r["cells"] == 3 and r["load_s"] > 0
    assert set(r["levers"]) == {"exact", "fold", "defer"}
    for lever in r["levers"].values():
        assert lever["world_renderer"] == "numpy"  # auto, the session's default on a CPU
        assert lever["cell_s"]["n"] == 3 and lever["cell_s"]["max"] >= lever["cell_s"]["p50"] > 0
        assert 0 < lever["start_s"] < lever["first_frame_s"]
        assert lever["warmup_s"] > 0
        parts = lever["parts_s"]
        assert {"world", "upload", "denoise", "commit", "decode", "host", "total"} <= set(parts)
        assert all(parts[k]["n"] == 2 for k in parts)
    assert r["levers"]["fold"]["vs_exact"]["cells"] == 3
    assert r["levers"]["fold"]["vs_exact"]["rel"] < 1e-4
    d = r["levers"]["defer"]["vs_exact"]
    assert (d["cells"], d["max_abs_diff"], d["rel"]) == (3, 0.0, 0.0)
    vs = r["levers"]["fold"]["vs_exact"]  # per cell against the reference: latents and shown frames
    assert vs["reference"] == "exact" and vs["latent_rmse"]["max"] < 1e-4 < vs["latent_rmse"]["ref_rms"]
    assert vs["frame_psnr_db"]["cells"] == 3 and vs["frame_psnr_db"]["min"] > 40
    assert r["world_check"]["cells"] == 2 and r["world_check"]["agreement"] >= 0.999
    assert r["world_speed"]["torch_fp64"]["cell_s"]["n"] == 3
    assert r["summary"]["best_lever"] in {"exact", "fold", "defer"}


def test_bench_deploy_serve_cpu_tiny_times_key_events_to_their_frames(tmp_path):
    r = _run(tmp_path, "--mode", "serve", "--events", "5")
    serve = r["serve"]
    assert r["mode"] == "serve" and serve["server"] == "in-process" and serve["lever"] == "exact"
    assert serve["events"] == serve["answered"] == 5
    lat = serve["latency_s"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["max"] < 30
    assert serve["messages"] >= 2 and serve["mean_message_bytes"] > 0
    server = serve["server_p50_s"]  # where the time goes on the server
    assert server["step"] > 0 and server["queued"] >= 0 and server["encode_prev"] >= 0
