"""What a new user gets from a wrong preset, override or root: one line naming it (and what is valid),
at once, before anything is written; and a runs root that belongs to one data root only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gc25d_core.config import ConfigError, load_config
from gc25d_pipeline.lib.project import RUNS_ROOT_RECORD, ArtifactStore, Gc25dProject, RawDataset

ROOT = Path(__file__).resolve().parent.parent


def _error(fn) -> str:
    with pytest.raises(ConfigError) as e:
        fn()
    return str(e.value)


def test_a_bad_override_is_named_with_its_value_not_the_preset_file():
    msg = _error(lambda: load_config("tiny", ["sft.optim.lr=abc"]))
    assert msg.startswith("override sft.optim.lr=abc: ") and "valid number" in msg
    assert "\n" not in msg and "tiny.yaml" not in msg
    # a misspelled key, too
    msg = _error(lambda: load_config("tiny", ["sft.optim.lrr=1"]))
    assert msg == "override sft.optim.lrr=1: Extra inputs are not permitted"
    # a section's own check over a key an override set names the override and the section
    msg = _error(lambda: load_config("tiny", ["timeline.num_frames=80"]))
    assert msg.startswith("override timeline.num_frames=80: timeline: ") and "\n" not in msg


def test_an_error_of_the_preset_file_still_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: x\n")
    msg = _error(lambda: load_config(bad, ["sft.optim.lr=1e-4"]))
    assert msg.startswith(f"{bad}: invalid configuration") and "seed" in msg and "override" not in msg


def test_a_misspelled_preset_is_one_line_listing_the_presets():
    msg = _error(lambda: load_config("tinyy"))
    assert msg == (
        "preset 'tinyy' does not exist; the presets are small, tiny, v10 (configs/<name>.yaml), "
        "or give a path to a .yaml file"
    )
    assert "presets are small, tiny, v10" in _error(lambda: load_config("../tiny"))


def test_the_projects_overrides_and_resource_fields_are_named_as_given():
    msg = _error(lambda: Gc25dProject(preset="tiny", overrides=["sft.optim.lr=abc"]).config())
    assert msg.startswith("override sft.optim.lr=abc (GC25D_OVERRIDES") and "\n" not in msg
    msg = _error(lambda: Gc25dProject(preset="tiny", raw=RawDataset(kind="v9")).config())
    assert msg.startswith("override raw.kind=v9 (project resource)")


def test_a_data_root_the_user_names_must_exist(tmp_path):
    missing = tmp_path / "nonexistent" / "dir"
    for project in (
        Gc25dProject(preset="tiny", overrides=[f"paths.data_root={missing}"]),
        Gc25dProject(preset="tiny", store=ArtifactStore(data_root=str(missing))),
    ):
        msg = _error(project.config)
        assert f"paths.data_root {missing} is not an existing folder" in msg
    assert not missing.parent.exists()  # nothing was created
    missing.mkdir(parents=True)
    # a runs root of its own: the checkout's outputs/tiny may record the preset's data root (make run)
    runs = f"paths.runs_root={tmp_path / 'runs'}"
    assert (
        Gc25dProject(preset="tiny", overrides=[f"paths.data_root={missing}", runs]).config().paths.data_root
        == missing
    )


def test_the_presets_own_roots_may_be_created_by_the_first_run(tmp_path, monkeypatch):
    # the embedded default generates its code world and data under data/tiny/ on first run
    monkeypatch.chdir(tmp_path)
    cfg = Gc25dProject(preset="tiny").config()
    assert cfg.paths.data_root == Path("data/tiny/gc25d") and not (tmp_path / "data").exists()
    # a code world's raw root is generated, so a new one is fine; a real (v10) one must hold data
    Gc25dProject(preset="tiny", raw=RawDataset(root=str(tmp_path / "new_raw"))).config()
    empty = tmp_path / "v10"
    empty.mkdir()
    msg = _error(Gc25dProject(preset="tiny", raw=RawDataset(kind="v10", root=str(empty))).config)
    assert msg.startswith(f"raw.root={empty} (project resource): raw.root {empty} holds no raw dataset")


def _project(data: Path, runs: Path) -> Gc25dProject:
    data.mkdir(parents=True, exist_ok=True)
    return Gc25dProject(preset="tiny", store=ArtifactStore(data_root=str(data), runs_root=str(runs)))


def test_another_data_root_cannot_write_into_a_runs_roots_folders(tmp_path):
    runs = tmp_path / "outputs"
    first = _project(tmp_path / "data", runs)
    cfg = first.config()
    first.run_dir(cfg, "sft")  # the first run folder records the data root
    assert json.loads((runs / RUNS_ROOT_RECORD).read_text())["data_root"] == str(tmp_path / "data")
    first.config()  # the same data root again: fine

    other = _project(tmp_path / "elsewhere", runs)
    msg = _error(other.config)
    assert msg.startswith(f"paths.data_root {tmp_path / 'elsewhere'}: paths.runs_root {runs} holds the run")
    # with a runs root of its own it runs
    _project(tmp_path / "elsewhere", tmp_path / "outputs2").config()


def test_a_runs_root_moved_with_its_data_still_matches(tmp_path):
    a = tmp_path / "a"
    project = _project(a / "data", a / "outputs")
    project.run_dir(project.config(), "sft")
    shutil.move(a, tmp_path / "b")  # a copied checkout: data and outputs moved together
    _project(tmp_path / "b" / "data", tmp_path / "b" / "outputs").config()
    # a runs root moved alone still names the same data root
    shutil.move(tmp_path / "b" / "outputs", tmp_path / "outputs")
    (tmp_path / "outputs" / RUNS_ROOT_RECORD).unlink()
    project = _project(tmp_path / "b" / "data", tmp_path / "outputs")
    project.run_dir(project.config(), "sft")
    shutil.move(tmp_path / "outputs", tmp_path / "c")
    _project(tmp_path / "b" / "data", tmp_path / "c").config()


def test_the_cli_reports_a_config_error_as_one_line(tmp_path):
    env = {"GC25D_PRESET": "tinyy", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "gc25d_pipeline.cli", "check-config"],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gc25d: preset 'tinyy' does not exist; the presets are small, tiny, v10 (configs/<name>.yaml), "
        "or give a path to a .yaml file"
    ]


def test_an_override_of_a_stage_section_lies_over_that_stages_preset_file():
    """``sft.max_steps=500``: the rest of ``sft`` is configs/sft/tiny.yaml's, as the stage asset
    builds it (not the section's bare defaults, which name no model to start from)."""
    from gc25d_core.config import read_yaml

    preset = read_yaml(ROOT / "configs" / "sft" / "tiny.yaml")
    cfg = load_config("tiny", ["sft.max_steps=500", "sft.model.gradient_checkpointing=true"])
    assert cfg.sft.max_steps == 500 and cfg.sft.model.gradient_checkpointing is True
    assert cfg.sft.model.init == preset["model"]["init"] and cfg.sft.optim.lr == preset["optim"]["lr"]
    assert cfg.stage3_dmd is None  # a stage no override names keeps no section
    assert Gc25dProject(preset="tiny", overrides=["sft.max_steps=500"]).stage_overrides("sft") == {
        "max_steps": 500
    }
