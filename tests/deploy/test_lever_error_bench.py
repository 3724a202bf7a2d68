"""bench.quality.lever_error: one export played twice through the CLI's live session, the second
with extra flags; the per-cell error it reports is zero where the paths compute the same latents and
not where they differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.quality import lever_error


def _run(export: Path, root: Path, against: str, tmp_path: Path) -> dict:
    out = tmp_path / "lever_error.json"
    argv = ["--export", str(export), "--cells", "6", "--out", str(out), f"--against={against}"]
    for key, value in (("paths.data_root", root / "data"), ("paths.runs_root", root / "runs")):
        argv += ["--set", f"{key}={value}"]
    argv += ["--set", f"raw.root={root / 'raw'}", "--set", "vae.fit.enabled=false"]
    result = lever_error.main(argv)
    assert json.loads(out.read_text()) == result
    return result


def test_a_folded_commit_plays_the_same_latents_and_frames(tiny_export, deploy_root, tmp_path):
    got = _run(tiny_export, deploy_root, "--fold-commit", tmp_path)
    assert got["cells"] == 6 and got["against"] == "--fold-commit"
    assert got["latent_rel_rmse"]["max"] == 0.0
    assert got["frame_psnr_db"] == {"identical_frames": 7}  # the anchor's decode and 6 cells
    for path in ("base", "against"):  # every cell from the first; the window is not full in 6
        assert got["cell_s"][path]["max"] >= got["cell_s"][path]["p50"] > 0
        assert got["cell_s_after_window"][path] is None


def test_another_noise_seed_is_reported_as_an_error(tiny_export, deploy_root, tmp_path):
    got = _run(tiny_export, deploy_root, "--seed 5", tmp_path)
    assert got["latent_rel_rmse"]["min"] > 0.01
    assert got["frame_psnr_db"]["identical_frames"] == 1  # the anchor's frame only
    assert got["frame_psnr_db"]["max"] < 60


def test_the_export_is_required(capsys):
    with pytest.raises(SystemExit):
        lever_error.main(["--against=--fp8"])
    assert "--export is required" in capsys.readouterr().err
