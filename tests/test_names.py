"""Names that become paths (gc25d_core.names): traversal, absolute paths, separators, empty names and
escaping symlinks are refused at every entry point with an error naming the field and the value."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import pytest

import gc25d_core.config as config_module
import gc25d_core.train.presets as presets_module
from gc25d_core.cache.manifest import shard_paths
from gc25d_core.config import CONFIGS_DIR, ConfigError, load_config, write_resolved
from gc25d_core.layout import clip_id, parse_clip_id
from gc25d_core.names import InvalidNameError, check_name, path_under
from gc25d_core.train.sft import sft_config, with_sft
from gc25d_pipeline.defs.train.assets import SftTeacherConfig, sft_teacher
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject

GOOD = ["tiny", "v10", "v000001", "P9C_default_s8946", "a.b-c_d", "_x", "7"]
BAD = ["../../outside", "/etc/passwd", "a/b", "", ".hidden", "..", "a..b", "x\n", "a\\b", "é", "a" * 129]


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass(name, tmp_path):
    assert check_name(name, "thing") == name
    assert path_under(tmp_path, name, "thing") == tmp_path / name


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_naming_field_and_value(name):
    with pytest.raises(InvalidNameError) as e:
        check_name(name, "thing")
    assert f"thing={name!r}" in str(e.value)


def test_non_str_is_refused():
    with pytest.raises(InvalidNameError, match="thing=3: must be a str"):
        check_name(3, "thing")


def test_symlink_escaping_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "evil").symlink_to(outside)
    (root / "fine").symlink_to(root / "real")  # a symlink that stays inside is a name like any other
    with pytest.raises(InvalidNameError, match=r"thing='evil': .* outside"):
        path_under(root, "evil", "thing")
    assert path_under(root, "fine", "thing") == root / "fine"
    # a root that is itself a symlink is resolved first: names under it are inside
    (tmp_path / "alias").symlink_to(root)
    assert path_under(tmp_path / "alias", "x", "thing") == tmp_path / "alias" / "x"


# --- the project preset ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../outside", "/etc/passwd", "a/b", "", ".hidden"])
def test_project_preset_name_is_a_name(name):
    with pytest.raises(ConfigError) as e:
        load_config(name)
    assert f"preset={name!r}" in str(e.value)


def test_project_preset_symlink_escaping_configs_is_refused(tmp_path, monkeypatch):
    configs, outside = tmp_path / "configs", tmp_path / "outside.yaml"
    configs.mkdir()
    shutil.copy(CONFIGS_DIR / "tiny.yaml", outside)
    shutil.copy(CONFIGS_DIR / "tiny.yaml", configs / "mine.yaml")
    (configs / "evil.yaml").symlink_to(outside)
    monkeypatch.setattr(config_module, "CONFIGS_DIR", configs)
    with pytest.raises(ConfigError, match=r"preset='evil': .* outside"):
        load_config("evil")
    assert load_config("mine").name == "tiny"


def test_project_preset_may_be_an_explicit_yaml_path(tmp_path):
    path = tmp_path / "elsewhere.yaml"
    shutil.copy(CONFIGS_DIR / "tiny.yaml", path)
    assert load_config(path).name == load_config("tiny").name == "tiny"
    assert load_config(str(path)).name == "tiny"


# --- the sft preset -------------------------------------------------------------------------------


def _outside_sft_preset(tmp_path: Path) -> Path:
    """A valid SFT section outside configs/sft/, as a bad preset name would reach it."""
    path = tmp_path / "outside.yaml"
    shutil.copy(CONFIGS_DIR / "sft" / "tiny.yaml", path)
    return path


def test_sft_preset_traversal_and_absolute_paths_are_refused(tmp_path):
    outside = _outside_sft_preset(tmp_path)
    cfg = load_config("tiny")
    relative = os.path.relpath(outside.with_suffix(""), CONFIGS_DIR / "sft")
    assert relative.startswith("../")
    for name in (relative, str(outside.with_suffix("")), "a/b", "", ".hidden"):
        with pytest.raises(ConfigError) as e:
            with_sft(cfg, name)
        assert f"sft_preset={name!r}" in str(e.value)


def test_sft_preset_symlink_escaping_configs_sft_is_refused(tmp_path, monkeypatch):
    outside = _outside_sft_preset(tmp_path)
    (tmp_path / "configs" / "sft").mkdir(parents=True)
    (tmp_path / "configs" / "sft" / "evil.yaml").symlink_to(outside)
    monkeypatch.setattr(presets_module, "CONFIGS_DIR", tmp_path / "configs")
    with pytest.raises(ConfigError, match=r"sft_preset='evil': .* outside"):
        with_sft(load_config("tiny"), "evil")


def test_sft_preset_good_names_pass():
    assert sft_config(with_sft(load_config("tiny"), "tiny")).model.preset == "tiny"
    assert sft_config(with_sft(load_config("v10"), "v10")).model.preset == "full"


# --- names in the cache and the processed layout --------------------------------------------------


@pytest.mark.parametrize("worker", ["../w", "a/b", "", ".w", "w\n"])
def test_cache_worker_names_are_names(worker):
    with pytest.raises(InvalidNameError, match="worker="):
        shard_paths(worker, "w0-000000")
    assert shard_paths("w0", "w0-000000") == ("shards/w0/w0-000000.tar", "receipts/w0/w0-000000.json")


@pytest.mark.parametrize("label", ["../../evil", "/tmp/x", "a/b", "", ".x", "x\n"])
def test_eval_input_export_labels_are_names(label, tmp_path):
    # a label names the export's folder of the eval's run folder (<label>/metrics.json)
    from gc25d_core.eval.spec import INPUT_FILE, EvalInput, read_model

    export = {"label": label, "path": "sft/e.safetensors", "sha256": None, "stage": "sft", "step": 1}
    ok = {**export, "label": "stage3_g1.5_ema"}
    doc = {"manifest_version": 1, "eval": {}, "exports": [ok, export]}
    (tmp_path / INPUT_FILE).write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        read_model(tmp_path, INPUT_FILE, EvalInput)
    assert str(tmp_path / INPUT_FILE) in str(e.value) and "exports.1" in str(e.value)
    assert f"label={label!r}" in str(e.value)
    doc["exports"] = [ok]
    (tmp_path / INPUT_FILE).write_text(json.dumps(doc))
    assert read_model(tmp_path, INPUT_FILE, EvalInput).exports[0].label == "stage3_g1.5_ema"


@pytest.mark.parametrize("scene", ["../x", "a/b", "", ".x", "x\n", "a" * 101])
def test_clip_id_parts_are_names(scene):
    with pytest.raises(ValueError, match="scene="):
        clip_id(scene, "run1", 0)
    assert parse_clip_id(clip_id("arena", "run1", 96)) == ("arena", "run1", 96)


# --- the sft_teacher asset: its run folder comes from the partition key ---------------------------


def _plant_sft_run(run_dir: Path) -> Path:
    """A finished SFT run folder as sft_teacher reads it: resolved config, val scores, one export."""
    write_resolved(with_sft(load_config("tiny"), "tiny"), run_dir)
    (run_dir / "val.jsonl").write_text(json.dumps({"step": 10, "cond_mse": 0.25}) + "\n")
    export = run_dir / "exports" / "step-000010.safetensors"
    export.parent.mkdir(parents=True)
    export.write_bytes(b"planted")
    return export


def _materialize_teacher(instance: dg.DagsterInstance, project: Gc25dProject, key: str):
    instance.add_dynamic_partitions("cache_snapshots", [key])
    return dg.materialize(
        [sft_teacher],
        partition_key=key,
        instance=instance,
        resources={"project": project},
        run_config={"ops": {"sft_teacher": {"config": {"min_step": 0}}}},
        raise_on_error=False,
    )


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    failures = [ev for ev in result.all_events if ev.is_step_failure]
    assert len(failures) == 1
    return failures[0].step_failure_data.error.message


def test_sft_teacher_refuses_partition_keys_that_leave_the_runs_root(tmp_path):
    runs = tmp_path / "runs"
    project = Gc25dProject(preset="tiny", store=ArtifactStore(runs_root=str(runs)))
    outside = tmp_path / "outside"
    _plant_sft_run(outside)  # what ../../outside and the absolute key would pick
    _plant_sft_run(runs / "sft" / "a" / "b")
    (runs / "sft" / "evil").symlink_to(outside)
    good_export = _plant_sft_run(runs / "sft" / "v000001")
    with dg.instance_for_test() as instance:
        for key in ("../../outside", str(outside), "a/b", "evil"):
            result = _materialize_teacher(instance, project, key)
            assert not result.success, key
            assert f"partition key={key!r}" in _failure_message(result)
            assert not result.asset_materializations_for_node("sft_teacher")
        result = _materialize_teacher(instance, project, "v000001")
        assert result.success
        md = result.asset_materializations_for_node("sft_teacher")[0].metadata
        assert Path(md["export"].value) == good_export


def test_sft_teacher_invoked_directly_refuses_a_traversal_key(tmp_path):
    """The same check outside a run (build_asset_context), and for the project's other stages."""
    runs = tmp_path / "runs"
    project = Gc25dProject(preset="tiny", store=ArtifactStore(runs_root=str(runs)))
    _plant_sft_run(tmp_path / "outside")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["../../outside", "v000001"])
        bad = dg.build_asset_context(partition_key="../../outside", instance=instance)
        with pytest.raises(dg.Failure, match=r"partition key='../../outside'"):
            sft_teacher(bad, config=SftTeacherConfig(min_step=0), project=project)
        good = dg.build_asset_context(partition_key="v000001", instance=instance)
        assert project.run_dir(project.config(), "sft", good) == runs / "sft" / "v000001"
        with pytest.raises(dg.Failure, match=r"stage='../sft'"):
            project.run_dir(project.config(), "../sft", good)
