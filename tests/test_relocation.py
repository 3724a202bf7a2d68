"""Run folders are not pinned to the checkout or the folder that wrote them: a resolved config.yaml
names no path into the checkout (the prompt data is found where the code is, at load time), and a
runs root moved to another path with its data (the original deleted) resumes a stage, plays and
evaluates from the moved copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gc25d_core.config import (
    DEFAULT_TEXT_DIR,
    REPO_ROOT,
    config_from_yaml,
    load_config,
    to_yaml,
    write_resolved,
)
from gc25d_core.handoff import FINAL
from gc25d_core.report import StdoutReporter
from gc25d_core.text import text_data

STAGE1 = {
    "engine": "torch",
    "max_steps": 4,
    "export_every": 2,
    "state_every": 2,
    "val": {"every": 2, "num_clips": 1},
}


def test_the_resolved_config_names_no_path_into_the_checkout(tmp_path):
    from gc25d_core.train.presets import with_stage

    cfg = load_config("tiny")
    for stage in ("sft", "stage1_tf", "stage2_cd", "stage3_dmd"):
        cfg = with_stage(cfg, stage, "tiny", {})
    text = to_yaml(cfg)
    assert str(REPO_ROOT) not in text, [line for line in text.splitlines() if str(REPO_ROOT) in line]
    again = config_from_yaml(write_resolved(cfg, tmp_path))
    assert again.text.data_dir is None and again.text.text_dir == DEFAULT_TEXT_DIR
    assert text_data(again.text).template.count("{motion}") == 1
    # a folder the user names stays as given
    mine = load_config("tiny", [f"text.data_dir={tmp_path}"])
    assert mine.text.text_dir == tmp_path and str(tmp_path) in to_yaml(mine)


def test_a_stage_asset_names_its_handoff_as_the_runs_root_is_configured():
    """The stage asset writes model.handoff from the runs root as configured: a relative runs root
    (the presets') gives a relative path, so the run folder's config.yaml pins no checkout."""
    import os

    from gc25d_pipeline.lib.stage_assets import as_configured

    absolute = Path(os.path.abspath("outputs/tiny")) / "sft" / "v000001" / "teacher.json"
    assert as_configured(absolute, Path("outputs/tiny")) == Path("outputs/tiny/sft/v000001/teacher.json")
    assert as_configured(Path("/r/sft/v1/teacher.json"), Path("/r")) == Path("/r/sft/v1/teacher.json")


def test_a_moved_runs_root_resumes_plays_and_evaluates(tmp_path, monkeypatch, capsys, one_thread):
    from gc25d_core.deploy.cli import main as deploy_main
    from gc25d_core.eval.evaluate import (
        EvalConfig,
        Reference,
        evaluate_export,
        exports_of_handoff,
        load_cases,
    )
    from gc25d_core.train.loop import run_stage
    from gc25d_core.train.presets import with_stage
    from tests.eval.world import eval_world
    from tests.train.world import random_teacher

    # the chain's first pieces in a, every path relative to it (as the presets name theirs)
    first = tmp_path / "a"
    first.mkdir()
    monkeypatch.chdir(first)
    here = Path(".")
    cfg = eval_world(here)  # processed clips with extensions and a published snapshot
    teacher = random_teacher(cfg, here)  # sft/teacher.json
    cfg = with_stage(cfg, "stage1_tf", "tiny", {**STAGE1, "model": {"handoff": str(teacher)}})
    run = Path("stage1_tf") / "v000001"
    part = run_stage(cfg, "stage1_tf", run, StdoutReporter(rank=0), max_steps=2)
    assert part["final_step"] == 2 and not (run / FINAL).exists()
    resolved = (run / "config.yaml").read_text()
    assert str(first) not in resolved and str(REPO_ROOT) not in resolved

    # the whole root moves (outputs and data); the original is gone
    moved = tmp_path / "b"
    shutil.move(first, moved)
    assert not first.exists()
    monkeypatch.chdir(moved)

    # the stage resumes from the moved run folder's own config, as a relaunch by hand would
    again = config_from_yaml(run / "config.yaml")
    rest = run_stage(again, "stage1_tf", run, StdoutReporter(rank=0))
    assert rest["resumed_from_step"] == 2 and rest["final_step"] == 4
    final = json.loads((run / FINAL).read_text())
    assert final["export"] == "stage1_tf/v000001/exports/step-000004.safetensors"

    # deploy play finds the moved export (the newest causal hand-off) and plays a few cells
    out = moved / "play.mp4"
    argv = ["play", "--actions", "fwd*2", "--out", str(out), "--device", "cpu"]
    argv += ["--set", "paths.runs_root=.", "--set", "paths.data_root=data", "--set", "vae.fit.enabled=false"]
    assert deploy_main(argv) == 0, capsys.readouterr().err
    played = json.loads(Path(str(out) + ".json").read_text())
    assert played["export"].startswith(str((run / "exports").resolve())) and len(played["cells"]) == 2

    # eval scores the moved hand-off's export
    (export,) = exports_of_handoff("stage1_tf", run / FINAL, again.paths.runs_root)
    assert export.path == (moved / run / "exports" / "step-000004.safetensors").resolve()
    ecfg = EvalConfig(clip28_clips=1, chain241_chains=0, clip28_cells=24, decode=False)
    cases, clips = load_cases(again, ecfg, None)
    result = evaluate_export(export, again, ecfg, cases, Reference(clips, None))
    assert result["sweeps"]["clip28"]["num_cases"] == 1


def test_an_eval_export_is_recorded_relative_to_the_runs_root_and_located_under_it(tmp_path):
    from gc25d_core.eval.spec import EvalExport

    root = tmp_path / "runs"
    export = EvalExport(
        "stage1_tf", root / "stage1_tf" / "v1" / "exports" / "step-4.safetensors", None, "x", 4
    )
    recorded = export.relative_to(root)
    assert recorded.path == Path("stage1_tf/v1/exports/step-4.safetensors")
    moved = recorded.located(tmp_path / "moved")
    assert moved.path == tmp_path / "moved" / "stage1_tf" / "v1" / "exports" / "step-4.safetensors"
    assert moved.recorded == "stage1_tf/v1/exports/step-4.safetensors"
    outside = EvalExport("x", tmp_path / "elsewhere.safetensors", None, "x", 1)
    assert outside.relative_to(root).path == outside.path  # outside the runs root: as given
    assert outside.located(root).path == outside.path
