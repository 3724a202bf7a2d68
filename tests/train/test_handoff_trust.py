"""Hand-offs are not trusted: they name exports relative to the runs root, a reader resolves them
inside the runs root it is configured with and refuses one that leads out ('..', an absolute path
elsewhere, a symbolic link), and the export's kind (causal or not, vocabulary, dims) must fit the
reading stage before anything is trained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gc25d_core.config import load_config
from gc25d_core.handoff import (
    FINAL,
    TEACHER,
    handoff_of,
    read_handoff,
    write_handoff,
    write_handoff_file,
)
from gc25d_core.hashing import sha256_file
from gc25d_core.models.configs import DEPLOY_CAUSAL, build_gcdit, tiny_config
from gc25d_core.models.export import save_export
from gc25d_core.report import StdoutReporter
from gc25d_core.schema import ConfigError

STAGE = {"engine": "torch", "max_steps": 2, "export_every": 2, "state_every": 2, "val": {"num_clips": 1}}


def _export(path: Path, seed: int = 0, causal: bool = False, **cfg) -> Path:
    from gc25d_core.flow import DEPLOY_AXIS

    torch.manual_seed(seed)
    model = build_gcdit(tiny_config(**cfg))
    kw = {"causal": DEPLOY_CAUSAL, "denoise_axis": DEPLOY_AXIS.timesteps} if causal else {}
    return save_export(path, model, data="codeworld", **kw)


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    _export(root / "sft" / "v1" / "exports" / "step-000002.safetensors")
    return root


def _raw(path: Path, **fields) -> Path:
    """A hand-off file with the given fields as they stand (what a hostile or old writer leaves)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": "sft", "step": 2, **fields}))
    return path


def test_written_relative_to_the_runs_root_and_read_back_inside_it(runs):
    export = runs / "sft" / "v1" / "exports" / "step-000002.safetensors"
    teacher = write_handoff_file(runs / "sft" / "v1" / TEACHER, handoff_of("sft", 2, export, runs_root=runs))
    doc = json.loads(teacher.read_text())
    assert doc["export"] == "sft/v1/exports/step-000002.safetensors" and doc["sha256"] == sha256_file(export)
    h = read_handoff(teacher, runs)
    assert h.export == export.resolve() and h.pick("export") == (export.resolve(), sha256_file(export))
    with pytest.raises(ConfigError, match="outside the runs root"):
        handoff_of("sft", 2, export, runs_root=runs / "sft" / "v2")


def test_a_copied_runs_root_reads_its_own_exports(runs, tmp_path):
    export = runs / "sft" / "v1" / "exports" / "step-000002.safetensors"
    write_handoff_file(runs / "sft" / "v1" / TEACHER, handoff_of("sft", 2, export, runs_root=runs))
    copy = tmp_path / "elsewhere" / "runs"
    shutil.copytree(runs, copy)
    shutil.rmtree(runs)
    h = read_handoff(copy / "sft" / "v1" / TEACHER, copy)
    assert h.export == (copy / "sft" / "v1" / "exports" / "step-000002.safetensors").resolve()


def test_names_leading_out_of_the_runs_root_are_refused_naming_file_and_field(runs, tmp_path):
    export = runs / "sft" / "v1" / "exports" / "step-000002.safetensors"
    sha = sha256_file(export)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(export, outside)
    (runs / "sft" / "v1" / "link.safetensors").symlink_to(outside)
    cases = {
        "dotdot": ({"export": "../outside.safetensors"}, "export='../outside.safetensors' contains '..'"),
        "absolute": ({"export": str(outside)}, "outside the runs root .*re-run the producing stage"),
        "symlink": ({"export": "sft/v1/link.safetensors"}, "outside the runs root .*symbolic link leads out"),
        "ema": (
            {"export": "sft/v1/exports/step-000002.safetensors", "ema_export": "../outside.safetensors"},
            "ema_export='../outside.safetensors' contains '..'",
        ),
    }
    for name, (fields, message) in cases.items():
        extra = {"ema_sha256": sha} if "ema_export" in fields else {}
        path = _raw(tmp_path / name / FINAL, sha256=sha, **fields, **extra)
        with pytest.raises(ConfigError, match=rf"hand-off {path}: .*{message}"):
            read_handoff(path, runs)
    # the older format: an absolute path inside the runs root names the same file as a relative one
    old = _raw(tmp_path / "old" / TEACHER, export=str(export.resolve()), sha256=sha)
    assert read_handoff(old, runs).export == export.resolve()
    with pytest.raises(ConfigError, match=r"sha256.*String should match pattern"):
        read_handoff(_raw(tmp_path / "bad" / TEACHER, export=str(export), sha256="x"), runs)


def test_a_run_folder_outside_the_runs_root_writes_no_handoff(runs, tmp_path):
    folder = tmp_path / "by_hand" / "run"
    _export(folder / "exports" / "step-000002.safetensors")
    warnings: list[str] = []
    assert write_handoff(folder, "sft", 2, folder / "exports", runs, warn=warnings.append) is None
    assert not (folder / FINAL).exists() and "outside paths.runs_root" in warnings[0]
    inside = runs / "sft" / "v1"
    assert write_handoff(inside, "sft", 2, inside / "exports", runs) == inside / FINAL


# -------------------------------------------------------------------- the export fits the reading stage


def test_init_exports_must_fit_the_stage(runs, tmp_path):
    """build_model with a hand-off init checks causal / bidirectional, the vocabulary and the dims
    against what the reading stage needs, naming the hand-off file and field."""
    from gc25d_core.stage_config import ModelConfig
    from gc25d_core.train.model import build_model

    cfg = load_config("tiny", {"paths": {"runs_root": str(runs)}})
    cases = {
        "causal": (dict(causal=True), False, "it is causal; this stage needs a bidirectional export"),
        "bidirectional": ({}, True, r"it is bidirectional \(causal=false\); this stage needs a causal"),
        "vocab": (dict(vocab="ids"), None, "vocab='ids', the project's ids are vocab='parts'"),
        "text_dim": (dict(text_dim=48), None, "text_dim=48, the data needs 64"),
    }
    for name, (kw, causal, message) in cases.items():
        export = _export(runs / "x" / name / "step-000001.safetensors", **kw)
        h = write_handoff_file(runs / "x" / name / FINAL, handoff_of("x", 1, export, runs_root=runs))
        m = ModelConfig(preset="tiny", init="handoff", handoff=h)
        pattern = rf"hand-off {h} \(field 'export', from stage3_dmd.real.handoff\): the export .*{message}"
        with pytest.raises(ConfigError, match=pattern):
            build_model(cfg, m, torch.device("cpu"), torch.float32, section="stage3_dmd.real", causal=causal)
    fits = ModelConfig(preset="tiny", init="handoff", handoff=runs / "x" / "causal" / FINAL)
    build_model(cfg, fits, torch.device("cpu"), torch.float32, section="stage2_cd.model", causal=True)


def _no_step_taken(run: Path) -> None:
    metrics = run / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()
    assert not list(run.glob("state/step-*")) and not list(run.glob("exports/*.safetensors"))


def test_stage1_refuses_a_causal_init_before_training(tmp_path):
    from gc25d_core.train.loop import run_stage
    from gc25d_core.train.presets import with_stage
    from tests.train.world import random_teacher, stage1_world

    cfg = stage1_world(tmp_path, STAGE)
    causal = random_teacher(cfg, tmp_path, causal=True)  # stage 1's own final.json, not the SFT teacher
    cfg = with_stage(cfg, "stage1_tf", "tiny", {**STAGE, "model": {"handoff": str(causal)}})
    with pytest.raises(ConfigError, match=rf"hand-off {causal} \(field 'export'.*needs a bidirectional"):
        run_stage(cfg, "stage1_tf", tmp_path / "run", StdoutReporter(rank=0))
    _no_step_taken(tmp_path / "run")


def test_stage3_refuses_a_causal_real_score_before_training(tmp_path):
    from gc25d_core.train.loop import run_stage
    from tests.train.world import random_teacher, stage3_world

    root = tmp_path
    cfg = stage3_world(root, {**STAGE, "critic_steps": 1, "max_cells": 23})
    causal = random_teacher(cfg, root, seed=3, causal=True)  # stage1_tf/final.json
    cfg = cfg.model_copy(
        update={
            "stage3_dmd": cfg.stage3_dmd.model_copy(  # type: ignore[union-attr]
                update={"real": cfg.stage3_dmd.real.model_copy(update={"handoff": causal})}  # type: ignore[union-attr]
            )
        }
    )
    with pytest.raises(ConfigError, match=rf"hand-off {causal} .*stage3_dmd.real.*needs a bidirectional"):
        run_stage(cfg, "stage3_dmd", root / "run", StdoutReporter(rank=0))
    _no_step_taken(root / "run")
