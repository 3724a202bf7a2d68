"""The training-stage asset factory (gc25d_pipeline.lib.stage_assets) without a training run: what
its assets declare, what they refuse at definition time, and a missing or broken hand-off failing at
once without retries. The real runs are in test_sft_pipeline.py."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from gc25d_core.config import load_config, write_resolved
from gc25d_core.handoff import TEACHER, read_handoff
from gc25d_core.hashing import sha256_file
from gc25d_core.train.sft import with_sft
from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.train.assets import STAGE_ASSETS, sft_teacher
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.stage_assets import RUN_FOLDER_KEY, STAGE_RETRY_POLICY, StageRunConfig, stage_asset
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

sft = STAGE_ASSETS["sft"]
# retries without delay: a Failure that allowed them would show STEP_UP_FOR_RETRY events quickly
QUICK_RETRIES = dg.RetryPolicy(max_retries=2)


def _from_teacher(retry_policy: dg.RetryPolicy = QUICK_RETRIES) -> dg.AssetsDefinition:
    return stage_asset(
        "sft_from_teacher", "sft", init_from=(sft_teacher, TEACHER, "export"), retry_policy=retry_policy
    )


def test_factory_asset_carries_what_it_is_given():
    parts = dg.StaticPartitionsDefinition(["v000001", "v000002"])
    policy = dg.RetryPolicy(max_retries=5, delay=7, backoff=dg.Backoff.LINEAR)
    asset = stage_asset(
        "stage_x",
        "sft",
        deps=[cache_snapshot, "other_asset"],
        partitions_def=parts,
        pool="gpu_big",
        tags={"gpu": "true", "team": "world"},
        retry_policy=policy,
        kinds=("torch", "fsdp"),
    )
    assert asset.partitions_def == parts
    assert asset.asset_deps[asset.key] == {cache_snapshot.key, dg.AssetKey("other_asset")}
    assert asset.op.pool == "gpu_big"
    tags = asset.tags_by_key[asset.key]
    assert tags["gpu"] == "true" and tags["team"] == "world" and "dagster/kind/fsdp" in tags
    assert asset.op.retry_policy == policy
    md = asset.metadata_by_key[asset.key]
    assert md[RUN_FOLDER_KEY] == "stage_x" and md["gc25d/entry_module"] == "gc25d_core.jobs.train"
    # every run config field says what it holds
    assert all(f.description for f in StageRunConfig.model_fields.values())


def test_sft_is_a_factory_asset_with_the_gpu_pool_and_retries():
    assert sft.partitions_def == cache_snapshots
    assert sft.asset_deps[sft.key] == {cache_snapshot.key}
    assert sft.op.pool == "gpu" and sft.tags_by_key[sft.key]["gpu"] == "true"
    assert sft.op.retry_policy == STAGE_RETRY_POLICY
    assert sft.metadata_by_key[sft.key][RUN_FOLDER_KEY] == "sft"
    assert sft_teacher.metadata_by_key[sft_teacher.key][RUN_FOLDER_KEY] == "sft"  # teacher.json's folder


def test_init_from_adds_the_upstream_dependency():
    asset = _from_teacher()
    assert asset.asset_deps[asset.key] == {sft_teacher.key}
    assert asset.metadata_by_key[asset.key]["gc25d/init_from"] == "sft_teacher: teacher.json (export)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage": "nope"}, "stage='nope' is not a core stage"),
        ({"module": "gc25d_core.jobs.nope"}, "module='gc25d_core.jobs.nope'"),
        ({"init_from": (cache_snapshot, TEACHER, "export")}, "cache_snapshot declares no 'gc25d/run_folder'"),
        ({"init_from": (sft_teacher, "../teacher.json", "export")}, "init_from file of x='../teacher.json'"),
        ({"init_from": (sft_teacher, TEACHER, "best")}, "init_from export='best'"),
        (
            {
                "init_from": (sft_teacher, TEACHER, "export"),
                "partitions_def": dg.StaticPartitionsDefinition(["a"]),
            },
            "init_from sft_teacher is partitioned by",
        ),
    ],
)
def test_definition_errors_name_the_field(kwargs, message):
    args = {"name": "x", "stage": "sft", **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stage_asset(**args)


def _project(tmp_path: Path) -> Gc25dProject:
    return Gc25dProject(preset="tiny", store=ArtifactStore(runs_root=str(tmp_path / "runs")))


def _materialize(assets, project: Gc25dProject, key: str = "v000001", run_config=None, launcher=None):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", [key])
        return dg.materialize(
            assets,
            partition_key=key,
            instance=instance,
            resources={"project": project, "torchrun": launcher or TorchrunLauncher(nproc_per_node=1)},
            run_config=run_config or {},
            raise_on_error=False,
        )


def _single_failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    step_events = [ev.event_type_value for ev in result.all_events if ev.is_step_event]
    assert "STEP_UP_FOR_RETRY" not in step_events, step_events  # allow_retries=False: once
    failures = [ev for ev in result.all_events if ev.is_step_failure]
    assert len(failures) == 1
    return failures[0].step_failure_data.error.message


@pytest.fixture
def published(monkeypatch):
    """Every partition's snapshot counts as published (test_graph_order.py checks the real check)."""
    monkeypatch.setattr(
        "gc25d_pipeline.lib.stage_assets.published_snapshot", lambda cfg, key: int(key.lstrip("v"))
    )


def test_missing_handoff_fails_at_once_naming_the_file(tmp_path, published):
    project = _project(tmp_path)
    missing = tmp_path / "runs" / "sft" / "v000001" / TEACHER
    message = _single_failure(_materialize([_from_teacher()], project))
    assert f"hand-off file {missing} does not exist" in message
    assert "materialize sft_teacher for partition v000001 first" in message
    assert not (tmp_path / "runs" / "sft_from_teacher").exists()  # nothing was launched


def test_broken_handoff_fails_at_once_naming_the_file(tmp_path, published):
    project = _project(tmp_path)
    teacher = tmp_path / "runs" / "sft" / "v000001" / TEACHER
    teacher.parent.mkdir(parents=True)
    teacher.write_text(json.dumps({"stage": "sft", "step": 10}))  # no export, no sha256
    message = _single_failure(_materialize([_from_teacher()], project))
    assert str(teacher) in message and "export" in message and "sha256" in message


def test_sft_teacher_writes_teacher_json(tmp_path):
    """On a planted SFT run folder (the real run is in test_sft_pipeline.py)."""
    run_dir = tmp_path / "runs" / "sft" / "v000001"
    write_resolved(with_sft(load_config("tiny"), "tiny"), run_dir)
    (run_dir / "val.jsonl").write_text(
        "".join(json.dumps({"step": s, "cond_mse": v}) + "\n" for s, v in ((10, 0.3), (20, 0.25)))
    )
    (run_dir / "exports").mkdir()
    for step in (10, 20):
        (run_dir / "exports" / f"step-{step:06d}.safetensors").write_bytes(f"planted {step}".encode())
    result = _materialize(
        [sft_teacher], _project(tmp_path), run_config={"ops": {"sft_teacher": {"config": {"min_step": 0}}}}
    )
    assert result.success
    handoff = read_handoff(run_dir / TEACHER, tmp_path / "runs")
    export = (run_dir / "exports" / "step-000020.safetensors").resolve()
    # the file names the export relative to the runs root: a moved runs root keeps its hand-offs
    assert (
        json.loads((run_dir / TEACHER).read_text())["export"] == "sft/v000001/exports/step-000020.safetensors"
    )
    assert (handoff.stage, handoff.step, handoff.export, handoff.ema_export) == ("sft", 20, export, None)
    assert handoff.sha256 == sha256_file(export)
    md = result.asset_materializations_for_node("sft_teacher")[0].metadata
    assert md["handoff"].value == str(run_dir / TEACHER)
    assert (md["step"].value, md["export"].value, md["sha256"].value) == (20, str(export), handoff.sha256)
    assert "path" not in md  # the export is named once


class _RefusingLauncher(TorchrunLauncher):
    """Fails any launch with a known message: shows whether the asset launched."""

    def run_job(self, context, module, launch, extras):
        raise dg.Failure("launched", allow_retries=False)


def _finished_sft(tmp_path: Path, project: Gc25dProject) -> Path:
    """A planted sft run folder for v000001 that reached the tiny preset's max_steps with the config
    a launch of the asset writes."""
    from gc25d_core.train.presets import with_stage

    run_dir = tmp_path / "runs" / "sft" / "v000001"
    cfg = with_stage(project.config(), "sft", "tiny", {"data": {"manifest_version": 1}})
    write_resolved(cfg, run_dir)
    exports = ["step-000200.safetensors", "step-000400.safetensors"]
    (run_dir / "exports").mkdir()
    for name in exports:
        (run_dir / "exports" / name).write_bytes(b"planted")
    done = {"stage": "sft", "final_step": 400, "exports": exports, "manifest_sha256": "ab" * 32}
    (run_dir / "done.json").write_text(json.dumps(done))
    (run_dir / "final.json").write_text("{}")
    return run_dir


def test_a_finished_run_with_the_same_config_is_not_launched_again(tmp_path, published):
    """A rerun with nothing changed: the stage asset reports the run's done.json with the data
    version the job would report, and starts no process; anything that leaves work to the job
    (another config, a missing export or hand-off, fresh) launches it."""
    from gc25d_core.train.loop import data_version

    project = _project(tmp_path)
    run_dir = _finished_sft(tmp_path, project)

    def materialize(run_config=None):
        return _materialize([sft], project, run_config=run_config, launcher=_RefusingLauncher())

    result = materialize()
    assert result.success
    (mat,) = result.asset_materializations_for_node("sft")
    assert mat.metadata["launched"].value is False and mat.metadata["final_step"].value == 400
    assert mat.tags["dagster/data_version"] == data_version(
        400, ["step-000200.safetensors", "step-000400.safetensors"], "ab" * 32
    )
    assert not (run_dir / "torchrun_logs").exists() and not (run_dir / "pipes").exists()

    fresh = {"ops": {"sft": {"config": {"fresh": True}}}}
    assert _single_failure(materialize(fresh)).endswith("Failure: launched\n")
    (run_dir / "final.json").unlink()
    assert _single_failure(materialize()).endswith("Failure: launched\n")  # no hand-off: the job writes it


@pytest.mark.parametrize("change", ["config", "step", "export", "stage", "nothing"])
def test_finished_run_asks_for_the_same_config_step_and_files(tmp_path, change):
    from gc25d_core.train.loop import finished_run
    from gc25d_core.train.presets import with_stage

    project = _project(tmp_path)
    run_dir = _finished_sft(tmp_path, project)
    cfg = with_stage(project.config(), "sft", "tiny", {"data": {"manifest_version": 1}})
    max_steps = None
    if change == "config":
        cfg = with_stage(project.config(), "sft", "tiny", {"data": {"manifest_version": 2}})
    elif change == "step":
        max_steps = 500
    elif change == "export":
        (run_dir / "exports" / "step-000200.safetensors").unlink()
    elif change == "stage":
        cfg = with_stage(project.config(), "stage1_tf", "tiny", {"data": {"manifest_version": 1}})
    got = finished_run(cfg, "stage1_tf" if change == "stage" else "sft", run_dir, max_steps)
    if change == "nothing":
        assert got is not None and got[0]["final_step"] == 400
    else:
        assert got is None


def test_the_projects_overrides_of_a_stage_section_reach_its_run(tmp_path, published):
    """GC25D_OVERRIDES="sft.max_steps=500;sft.model.gradient_checkpointing=true": the stage's
    preset file gives the rest of the section, the overrides win over it (and keep the hand-off's
    fields beside theirs), so a finished run of the preset's 400 steps is trained on, not reported."""
    import yaml

    plain = _project(tmp_path)
    run_dir = _finished_sft(tmp_path, plain)
    # without overrides the finished run is reported as it is
    assert _materialize([sft], plain, launcher=_RefusingLauncher()).success
    overridden = Gc25dProject(
        preset="tiny",
        overrides=["sft.max_steps=500", "sft.model.gradient_checkpointing=true"],
        store=ArtifactStore(runs_root=str(tmp_path / "runs")),
    )
    message = _single_failure(_materialize([sft], overridden, launcher=_RefusingLauncher()))
    assert message.endswith("Failure: launched\n")  # 400 of 500 steps: the job resumes and trains on
    written = yaml.safe_load((run_dir / "config.yaml").read_text())["sft"]
    assert written["max_steps"] == 500 and written["model"]["gradient_checkpointing"] is True
    assert written["data"]["manifest_version"] == 1
    assert written["model"]["overrides"]["dim"] == 192 and written["optim"]["lr"] == 5e-4  # the preset's
