"""The code location loads, validates, and has the graph we expect."""

import subprocess
import sys
from pathlib import Path

import dagster as dg

from gc25d_pipeline.definitions import defs

ROOT = Path(__file__).resolve().parent.parent


def test_definitions_load_and_graph():
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"raw_source", "clips_index", "text_table", "cluster_check"} <= keys
    assert dg.AssetKey("raw_source") in graph.get(dg.AssetKey("clips_index")).parent_keys
    assert dg.AssetKey("tiny_vae") in graph.get(dg.AssetKey("latents")).parent_keys
    assert {"stage3_dmd", "deploy_export", "eval"} <= keys
    assert dg.AssetKey("deploy_export") in graph.get(dg.AssetKey("eval")).parent_keys
    job = defs.resolve_job_def("full_chain")
    assert {n.name for n in job.graph.node_defs} >= {
        "tiny_vae",
        "raw_source",
        "clips_index",
        "text_table",
        "cluster_check",
    }
    assert graph.get(dg.AssetKey("cluster_check")).assets_def.op.pool == "gpu"


def test_dagster_cli_validates_the_workspace(tmp_path):
    env = {"DAGSTER_HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    (tmp_path / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All code locations passed validation" in proc.stdout + proc.stderr


def test_core_library_imports_no_dagster():
    """gc25d_core may use dagster_pipes (through report) but never dagster itself."""
    code = (
        "import importlib, pkgutil, sys, gc25d_core\n"
        "skip = {'gc25d_core.codeworld.__main__', 'gc25d_core.cache.__main__'}\n"
        "for m in pkgutil.walk_packages(gc25d_core.__path__, 'gc25d_core.'):\n"
        "    if m.name not in skip: importlib.import_module(m.name)\n"
        "bad = sorted(k for k in sys.modules if k == 'dagster' or k.startswith('dagster.'))\n"
        "print('IMPORTED', bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for path in (ROOT / "gc25d_core").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            assert not (
                stripped.startswith("import dagster") and not stripped.startswith("import dagster_pipes")
            ), path
            assert not (stripped.startswith("from dagster ") or stripped.startswith("from dagster.")), path


def test_the_operator_cli_starts_without_torch():
    """``python -m gc25d_pipeline.cli`` runs several times in every ``make run`` (check-config,
    sync-snapshots, the tables, the timeline): its import leaves torch (≈ 1.4 s a call) to the
    commands that need it."""
    code = "import sys, gc25d_pipeline.cli\nprint(sorted(k for k in sys.modules if k.split('.')[0] == 'torch')[:3])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def _undescribed(model: type, where: str) -> list[str]:
    """Fields of a Dagster config / resource class (and the config classes nested in it) without a
    description: the UI's launchpad and resource pages show nothing else about them."""
    import pydantic

    out = []
    for name, field in model.model_fields.items():
        if not field.description:
            out.append(f"{where}.{name}")
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, pydantic.BaseModel):
            out += _undescribed(nested, f"{where}.{name}")
    return out


def test_every_job_sensor_resource_and_run_config_field_is_described():
    from gc25d_pipeline.lib.torchrun import TorchrunLauncher

    repo = defs.get_repository_def()
    missing = [
        f"job {j.name}" for j in repo.get_all_jobs() if not j.name.startswith("__") and not j.description
    ]
    missing += [f"sensor {s.name}" for s in repo.sensor_defs if not s.description]
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if node.is_materializable and not node.description:
            missing.append(f"asset {key.to_user_string()}")
    from gc25d_pipeline.defs.eval.assets import EvalRunConfig
    from gc25d_pipeline.defs.ops.assets import ClusterCheckConfig
    from gc25d_pipeline.defs.train.assets import SftTeacherConfig
    from gc25d_pipeline.lib.clip_jobs import ClipJobConfig
    from gc25d_pipeline.lib.project import Gc25dProject
    from gc25d_pipeline.lib.stage_assets import StageRunConfig

    for cls in (
        EvalRunConfig,
        ClusterCheckConfig,
        SftTeacherConfig,
        ClipJobConfig,
        StageRunConfig,
        Gc25dProject,
        TorchrunLauncher,
    ):
        missing += _undescribed(cls, cls.__name__)
    assert not missing, missing


def test_raw_source_shows_the_code_worlds_progress_in_the_run_log(tmp_path, monkeypatch):
    """The raw source's generation (minutes at the larger presets' sizes, inside the Dagster
    process) logs each run, the frames' rate and ETA, and a summary, in the asset's run log; a
    second materialization generates nothing and says so."""
    import dataclasses

    from gc25d_core.codeworld import PRESETS, TINY_GEOMETRY, get_preset
    from gc25d_core.codeworld.presets import Preset
    from gc25d_pipeline.defs.data.assets import raw_source
    from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject, RawDataset

    short = [dataclasses.replace(s, num_frames=12) for s in get_preset("tiny").runs(0)[:2]]
    monkeypatch.setitem(PRESETS, "tiny", Preset("tiny", TINY_GEOMETRY, lambda seed: short))
    monkeypatch.setenv("GC25D_CODEWORLD_WORKERS", "1")  # in this process: its lines as they come
    (tmp_path / "data").mkdir()
    project = Gc25dProject(
        preset="tiny",
        store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs")),
        raw=RawDataset(root=str(tmp_path / "raw")),
    )
    with dg.instance_for_test() as instance:
        first = dg.materialize([raw_source], instance=instance, resources={"project": project})
        second = dg.materialize([raw_source], instance=instance, resources={"project": project})
        logs = [[r.user_message for r in instance.all_logs(res.run_id)] for res in (first, second)]
    for s in short:
        assert (
            sum(f"codeworld: generating {s.subset}/{s.scene}/{s.run} (12 frames)" in m for m in logs[0]) == 1
        )
    assert [m for m in logs[0] if m.startswith("frames 24/24 (")]  # Progress's last line: rate, ETA 0s
    assert sum("raw source: code world tiny (seed 0), 2 runs (2 generated in" in m for m in logs[0]) == 1
    assert not [m for m in logs[1] if "codeworld: generating" in m]
    again = "2 already there), 24 frames, 0 clips"
    assert sum("2 runs (0 generated in" in m and again in m for m in logs[1]) == 1
