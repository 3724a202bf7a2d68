"""SFT through Dagster: the per-snapshot sft asset launches the real 2-rank torchrun job, reports once,
and sft_teacher applies the SPEC §10 pick to its run folder."""

import os
from pathlib import Path

import dagster as dg
import pytest

from gc25d_pipeline.defs.cache.assets import cache_snapshot
from gc25d_pipeline.defs.train.assets import sft, sft_teacher
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

from .train.world import VAL_RUN, sft_world

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_sft_and_teacher_per_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    )
    sft_world(tmp_path)  # processed clips + published snapshot v000001 under tmp_path
    project = Gc25dProject(
        preset="tiny",
        overrides=[
            f"cache.store={tmp_path / 'cache'}",
            "cache.samples_per_shard=2",
            f"index.val_runs=[{VAL_RUN}]",
        ],
        store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs")),
    )
    resources = {"project": project, "torchrun": TorchrunLauncher(nproc_per_node=2)}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        result = dg.materialize(
            [cache_snapshot, sft, sft_teacher],
            partition_key="v000001",
            instance=instance,
            resources=resources,
            run_config={
                "ops": {"sft": {"config": {"max_steps": 10}}, "sft_teacher": {"config": {"min_step": 0}}}
            },
        )
        assert result.success
        sft_mats = result.asset_materializations_for_node("sft")
        assert len(sft_mats) == 1  # rank 0 only
        md = sft_mats[0].metadata
        assert md["snapshot"].value == "v000001" and md["world_size"].value == 2
        teacher = result.asset_materializations_for_node("sft_teacher")[0].metadata
        assert teacher["step"].value in (10,) and Path(teacher["export"].value).is_file()
        run_dir = tmp_path / "runs" / "sft" / "v000001"
        assert sorted(p.name for p in (run_dir / "exports").iterdir()) == ["step-000010.safetensors"]
