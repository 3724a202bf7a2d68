"""The fast decoder (gc25d_core.models.fast_decoder) and its job (gc25d_core.jobs.fast_decoder): cell
by cell output shapes, a deterministic fit (two runs, one SHA256), an unchanged rerun kept, a killed
fit resumed to the same weights, and bad inputs refused naming the file and the field."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import torch

from gc25d_core.config import load_config
from gc25d_core.index import write_index
from gc25d_core.jobs.fast_decoder import run_fast_decoder
from gc25d_core.layout import Layout, LayoutError, Shapes
from gc25d_core.models.fast_decoder import (
    FastDecoder,
    StreamingFastDecoder,
    decode_clip,
    load_fast_decoder,
    load_fast_decoder_for,
    record_file,
    weights_file,
)
from gc25d_core.models.loading import WeightsError
from gc25d_core.schema import ConfigError
from gc25d_core.train.synthetic import synthetic_row, write_synthetic_latents

FIT = {
    "enabled": True,
    "steps": 6,
    "batch": 2,
    "width": 8,
    "ckpt_every": 2,
    "cells_per_clip": 2,
    "max_clips": 2,
    "heldout_clips": 1,
    "threads": 1,
}


class _Rep:
    """The job's reporter, recording what it is told; ``stop_at``: raise at that step (a kill)."""

    def __init__(self, stop_at: int | None = None):
        self.lines: list[str] = []
        self.stop_at = stop_at

    def log(self, message: str, level: str = "info") -> None:
        self.lines.append(message)

    def metrics(self, step: int | None = None, **values: float) -> None:
        if step == self.stop_at:
            raise KeyboardInterrupt(f"killed at step {step}")


def _frames(clip_id: str) -> np.ndarray:
    seed = int(hashlib.sha256(clip_id.encode()).hexdigest()[:8], 16)
    base = np.random.default_rng(seed).integers(0, 256, (1, 4, 8, 3))
    return np.repeat(np.repeat(np.repeat(base, 81, 0), 16, 1), 16, 2).astype(np.uint8)  # [81, 64, 128, 3]


def _cfg(root: Path, **fit):
    return load_config(
        "tiny",
        {
            "paths": {"data_root": str(root / "data"), "runs_root": str(root / "runs")},
            "raw": {"root": str(root / "raw")},
            "vae": {"fit": {"enabled": False}},  # the seeded tiny random VAE: no tiny_vae asset here
            "fast_decoder": {**FIT, **fit},
        },
    )


def _project(root: Path, **fit):
    cfg = _cfg(root, **fit)
    layout, shapes = Layout(cfg.paths.data_root), Shapes.of(cfg)
    rows = [synthetic_row("R1", 0, "train"), synthetic_row("R1", 96, "train"), synthetic_row("R2", 0, "val")]
    for i, row in enumerate(rows):
        write_synthetic_latents(layout, shapes, row, i, ["p"] * 21, np.zeros((21, 5), np.uint8))
    write_index(layout, rows, {"R1": "train", "R2": "val"})
    return cfg


def _fit(cfg, rep=None):
    return run_fast_decoder(cfg, rep or _Rep(), frames_of=lambda row: _frames(row.clip_id))


def test_cells_decode_to_one_then_four_frames():
    torch.manual_seed(0)
    dec = FastDecoder(width=8)
    z = torch.randn(48, 3, 2, 3)
    stream = StreamingFastDecoder(dec)
    shapes = [tuple(stream.push(z[:, k : k + 1]).shape) for k in range(3)]
    assert shapes == [(1, 3, 1, 32, 48), (1, 3, 4, 32, 48), (1, 3, 4, 32, 48)]
    assert decode_clip(dec, z).shape == (3, 9, 32, 48)
    stream.reset()
    assert stream.push(z[:, :1]).shape[2] == 1  # a new clip starts from its anchor cell again
    with pytest.raises(ValueError, match=r"\[B, 48, 1, h, w\]"):
        stream.push(z[:, :2])


def test_the_fit_is_deterministic_kept_when_unchanged_and_resumes(tmp_path):
    cfg = _project(tmp_path / "a")
    first = _fit(cfg)
    assert first["used"] and not first["skipped"] and first["resumed_from_step"] == 0
    rec = json.loads(record_file(cfg).read_text())
    for k in ("psnr_vs_vae_db", "psnr_vs_gt_db", "vae_psnr_vs_gt_db", "gap_db", "cell_ms"):
        assert np.isfinite(rec[k]), k
    assert rec["heldout_clips"] == 1 and rec["train_clips"] == 2
    assert rec["path"] == weights_file(cfg).name and str(tmp_path) not in record_file(cfg).read_text()
    assert _fit(cfg)["skipped"]  # same inputs: the file is kept

    # a second project with the same inputs: the same weights, byte for byte
    shutil.copytree(tmp_path / "a" / "data", tmp_path / "b" / "data")
    other = _cfg(tmp_path / "b")
    weights_file(other).unlink()
    record_file(other).unlink()
    assert _fit(other)["sha256"] == first["sha256"]

    # killed at step 5 (checkpoint at step 4), then run again: resumed, the same weights
    killed = _cfg(tmp_path / "b")
    weights_file(killed).unlink()
    record_file(killed).unlink()
    with pytest.raises(KeyboardInterrupt):
        _fit(killed, _Rep(stop_at=5))
    assert weights_file(killed).with_suffix(".ckpt.pt").is_file() and not weights_file(killed).exists()
    resumed = _fit(killed)
    assert resumed["resumed_from_step"] == 4 and resumed["sha256"] == first["sha256"]
    assert not weights_file(killed).with_suffix(".ckpt.pt").exists()

    # another setting is another input: refitted, other weights
    changed = _fit(_cfg(tmp_path / "b", seed=1))
    assert not changed["skipped"] and changed["sha256"] != first["sha256"]

    dec = load_fast_decoder_for(cfg)
    assert isinstance(dec, FastDecoder) and dec.width == 8


def test_bad_inputs_are_refused_naming_the_file_and_the_field(tmp_path):
    cfg = _project(tmp_path)
    with pytest.raises(ConfigError, match="fast_decoder.width"):
        _cfg(tmp_path, width=30)
    with pytest.raises(WeightsError, match="fast_decoder.json does not exist"):
        load_fast_decoder_for(cfg)

    bad = Layout(cfg.paths.data_root).latents(synthetic_row("R1", 96, "train").clip_id)
    torch.save({"latent": torch.zeros(3)}, bad)
    with pytest.raises(LayoutError, match=str(bad)):
        _fit(cfg)

    _project(tmp_path)  # good latents again
    rec = _fit(cfg)
    path = record_file(cfg)
    path.write_text(json.dumps({"inputs_key": rec["inputs_key"]}))
    with pytest.raises(
        WeightsError, match=rf"{path}: not a fast decoder record \(field sha256: Field required\)"
    ):
        load_fast_decoder_for(cfg)
    with pytest.raises(
        WeightsError, match=rf"{path}: not a fast decoder record \(field sha256: Field required\)"
    ):
        _fit(cfg)
    with pytest.raises(WeightsError, match=f"{weights_file(cfg)}: sha256 .* does not match expected"):
        load_fast_decoder(weights_file(cfg), expected_sha256="0" * 64, field="expected")


def test_the_asset_does_nothing_unless_enabled(tmp_path):
    from gc25d_pipeline.defs.deploy.fast_decoder import fast_decoder
    from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
    from gc25d_pipeline.lib.torchrun import TorchrunLauncher

    (tmp_path / "data").mkdir()
    project = Gc25dProject(
        preset="tiny", store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs"))
    )
    assert not project.config().fast_decoder.enabled  # the default: make run is not lengthened
    out = fast_decoder(dg.build_asset_context(), project=project, torchrun=TorchrunLauncher())
    assert out.metadata["used"] is False and "fast_decoder.enabled" in out.metadata["reason"]
