"""SFT through Dagster: the per-snapshot sft asset launches the real 2-rank torchrun job, reports once,
sft_teacher applies the SPEC §10 pick to its run folder and writes teacher.json, and a stage asset
built with init_from=(sft_teacher, "teacher.json", "export") starts from the picked export."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import torch

from gc25d_core.config import config_from_yaml
from gc25d_core.handoff import TEACHER, read_handoff
from gc25d_core.hashing import sha256_file
from gc25d_core.models.export import export_state_dict, read_export
from gc25d_core.train.model import build_model
from gc25d_core.train.sft import sft_config, with_sft
from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.train.assets import STAGE_ASSETS, sft_teacher
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.stage_assets import stage_asset
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

from .train.world import VAL_RUN, sft_world

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
SFT_STEPS, FINETUNE_STEPS = 10, 2

# the downstream stage of the test: SFT itself, fine-tuning the picked teacher (a real 2-step run)
sft_finetune = stage_asset("sft_finetune", "sft", init_from=(sft_teacher, TEACHER, "export"))


@dataclass
class TrainedSnapshot:
    root: Path
    project: Gc25dProject
    resources: dict
    instance: dg.DagsterInstance
    result: dg.ExecuteInProcessResult

    @property
    def sft_dir(self) -> Path:
        return self.root / "runs" / "sft" / "v000001"

    def materialize_after(self, asset: dg.AssetsDefinition, max_steps: int) -> tuple[dict, Path]:
        """``asset`` on v000001 after the teacher pick: its metadata and its run folder."""
        assert self.result.success
        name = asset.key.to_user_string()
        result = dg.materialize(
            [asset],
            partition_key="v000001",
            instance=self.instance,
            resources=self.resources,
            run_config={"ops": {name: {"config": {"max_steps": max_steps}}}},
        )
        assert result.success
        return result.asset_materializations_for_node(name)[0].metadata, self.root / "runs" / name / "v000001"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Iterator[TrainedSnapshot]:
    """cache_snapshot → sft (10 steps, 2 ranks) → sft_teacher on v000001, once for this module."""
    root = tmp_path_factory.mktemp("sft_pipeline")
    with pytest.MonkeyPatch.context() as mp:
        # the ranks compile DeepSpeed's CPU Adam once; keep the shared cache if one is set
        mp.setenv(
            "TORCH_EXTENSIONS_DIR",
            os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions")),
        )
        sft_world(root)  # processed clips + published snapshot v000001 under root
        project = Gc25dProject(
            preset="tiny",
            overrides=[
                f"cache.store={root / 'cache'}",
                "cache.samples_per_shard=2",
                f"index.val_runs=[{VAL_RUN}]",
            ],
            store=ArtifactStore(data_root=str(root / "data"), runs_root=str(root / "runs")),
        )
        resources = {"project": project, "torchrun": TorchrunLauncher(nproc_per_node=2)}
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
            result = dg.materialize(
                [cache_snapshot, STAGE_ASSETS["sft"], sft_teacher],
                partition_key="v000001",
                instance=instance,
                resources=resources,
                run_config={
                    "ops": {
                        "sft": {"config": {"max_steps": SFT_STEPS}},
                        "sft_teacher": {"config": {"min_step": 0}},
                    }
                },
            )
            yield TrainedSnapshot(root, project, resources, instance, result)


def _metrics(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, filter(None, lines))}


def test_sft_and_teacher_per_snapshot(trained):
    assert trained.result.success
    sft_mats = trained.result.asset_materializations_for_node("sft")
    assert len(sft_mats) == 1  # rank 0 only
    md = sft_mats[0].metadata
    assert md["snapshot"].value == "v000001" and md["world_size"].value == 2
    run_dir = trained.sft_dir
    assert sorted(p.name for p in (run_dir / "exports").iterdir()) == ["step-000010.safetensors"]
    # the curves: TensorBoard event files of rank 0, and the same records plotted in the metadata
    assert md["tensorboard"].value == str(run_dir / "tensorboard")
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert md["curves"].value.startswith("![training curves](data:image/png;base64,")

    # the pick is handed off as teacher.json in the SFT run folder, naming the export and its hash
    teacher = trained.result.asset_materializations_for_node("sft_teacher")[0].metadata
    handoff = read_handoff(run_dir / TEACHER, trained.root / "runs")
    export = (run_dir / "exports" / "step-000010.safetensors").resolve()
    assert (handoff.stage, handoff.step, handoff.export) == ("sft", SFT_STEPS, export)
    assert handoff.sha256 == sha256_file(export)
    assert teacher["handoff"].value == str(run_dir / TEACHER)
    assert (teacher["step"].value, teacher["export"].value) == (SFT_STEPS, str(export))
    assert teacher["sha256"].value == handoff.sha256


def test_stage_initialised_from_the_teacher_handoff(trained):
    md, run_dir = trained.materialize_after(sft_finetune, FINETUNE_STEPS)
    teacher_json = trained.sft_dir / TEACHER
    assert md["init_handoff"].value == str(teacher_json)

    # the resolved config in its own run folder points at the hand-off file, nothing re-derived
    model = sft_config(config_from_yaml(run_dir / "config.yaml")).model
    assert (model.init, model.handoff, model.handoff_export) == ("handoff", teacher_json, "export")

    # step 1 draws the same batch, t and noise as SFT's step 1 (same seed, data, snapshot): from a
    # random init its record would be SFT's step-1 record exactly (deterministic tiny preset)
    sft_step1, ft_step1 = _metrics(trained.sft_dir)[1], _metrics(run_dir)[1]
    assert ft_step1["t_mean"] == sft_step1["t_mean"]  # the same draws
    # 10 tiny SFT steps lower this batch's loss by a few per cent, well above run-to-run noise (none)
    assert ft_step1["loss"] < (1 - 1e-3) * sft_step1["loss"], (ft_step1["loss"], sft_step1["loss"])
    # the random init's condition encoder starts at zero output (sem_rms 0); the teacher's does not
    assert sft_step1["sem_rms"] == 0.0 and ft_step1["sem_rms"] > 0.0

    # its export after 2 small warm-up steps lies next to the teacher, far from the random init
    cfg = with_sft(trained.project.config(), "tiny")
    random_init = export_state_dict(
        build_model(cfg, sft_config(cfg).model, torch.device("cpu"), torch.float32)
    )
    teacher, _ = read_export(read_handoff(teacher_json, trained.root / "runs").export)
    tuned, _ = read_export(run_dir / "exports" / f"step-{FINETUNE_STEPS:06d}.safetensors")

    def sq_dist(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return sum(float((a[k].float() - b[k].float()).pow(2).sum()) for k in a)

    to_teacher, to_random = sq_dist(tuned, teacher), sq_dist(tuned, random_init)
    assert to_teacher < 0.1 * to_random, (to_teacher, to_random)


def test_stage1_asset_trains_the_causal_student_from_the_teacher(trained):
    """The product asset after sft_teacher: stage1_tf resolves its init from teacher.json, trains
    through the real 2-rank entry point and writes a causal export (final.json comes only at the
    preset's max_steps; this run stops at step 2)."""
    _, run_dir = trained.materialize_after(STAGE_ASSETS["stage1_tf"], FINETUNE_STEPS)
    from gc25d_core.train.presets import stage_config

    model = stage_config(config_from_yaml(run_dir / "config.yaml"), "stage1_tf").model
    assert (model.init, model.handoff) == ("handoff", trained.sft_dir / TEACHER)
    assert not (run_dir / "final.json").exists()
    _, meta = read_export(run_dir / "exports" / f"step-{FINETUNE_STEPS:06d}.safetensors")
    assert meta.causal is not None and meta.extra["stage"] == "stage1_tf"
    assert (
        json.loads(meta.extra["init_ckpt"])["sha256"]
        == read_handoff(trained.sft_dir / TEACHER, trained.root / "runs").sha256
    )


def test_the_sft_preview_is_kept_by_its_export(trained, monkeypatch):
    """The asset's validation sample is made once per export file: a rerun on the finished run shows
    the kept one without building the model; a changed export file makes it again."""
    from gc25d_core.train import previews
    from tests.eval.world import with_random_vae

    cfg = with_random_vae(config_from_yaml(trained.sft_dir / "config.yaml"))  # no tiny_vae asset here
    first = previews.sft_preview(trained.sft_dir, cfg)
    if "sample_png" not in first:
        pytest.fail(f"no validation sample was made for {trained.sft_dir}: {sorted(first)}")

    def refuse(*args, **kwargs):
        raise AssertionError("the kept sample was made again")

    monkeypatch.setattr(previews, "predict_x0", refuse)
    again = previews.sft_preview(trained.sft_dir, cfg)
    keys = ("sample_png", "sample_video", "sample_step", "sample_clip", "sample_mse")
    assert [again[k] for k in keys] == [first[k] for k in keys]
    export = trained.sft_dir / "exports" / f"step-{SFT_STEPS:06d}.safetensors"
    os.utime(export, ns=(export.stat().st_atime_ns, export.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(AssertionError, match="made again"):
        previews.sft_preview(trained.sft_dir, cfg)
