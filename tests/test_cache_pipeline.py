"""Training cache in the graph: training_cache publishes snapshots from the processed layout, the
sensor adds one partition + one run per new immutable snapshot, and each snapshot is deep-verified."""

import json

import dagster as dg
import numpy as np
import pytest
import torch

from gc25d_core.cache import SCHEMA_GC25D, LocalStore, pack_shard
from gc25d_core.cache.snapshots import list_versions, read_snapshot
from gc25d_core.cache.stores import open_cache_store
from gc25d_core.index import write_index
from gc25d_core.layout import Layout, Shapes, write_cond
from gc25d_pipeline.defs.cache.assets import cache_snapshot, training_cache
from gc25d_pipeline.defs.cache.sensors import cache_snapshot_sensor
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject

from .train.world import synthetic_row, write_synthetic_latents


def _write_clips(cfg, runs: dict[str, str], starts=(0, 96)) -> None:
    """A processed layout without raw data: index rows, latents and cond for each clip."""
    layout, shapes = Layout(cfg.paths.data_root), Shapes.of(cfg)
    rows = []
    for run, split in runs.items():
        for s in starts:
            row = synthetic_row(run, s, split)
            rows.append(row)
            write_synthetic_latents(
                layout, shapes, row, s + len(run), ["p"] * 21, np.zeros((21, 5), np.uint8)
            )
            write_cond(layout, row.clip_id, np.full(shapes.cond, 1, np.uint8), shapes)
    write_index(layout, rows, runs)


def _tick(instance, project, cursor):
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"project": project}) as ctx:
        return cache_snapshot_sensor(ctx)


@pytest.fixture(name="project")
def cache_project(tmp_path):
    """A tiny project with two clips (a val and a train run) and its own data, runs and cache roots."""
    (tmp_path / "data").mkdir()  # a data root the user names must exist (config.check_given_roots)
    p = Gc25dProject(
        preset="tiny",
        overrides=[f"cache.store={tmp_path / 'cache'}", "cache.samples_per_shard=2"],
        store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs")),
    )
    _write_clips(p.config(), {"R10_s1512": "val", "R10_s2024": "train"})
    return p


def test_training_cache_publishes_then_is_idempotent(project):
    first = training_cache(dg.build_asset_context(), project=project)
    assert first.metadata["snapshot"] == "v000001" and first.metadata["num_shards_packed"] == 2
    assert first.metadata["added_samples"] == 4
    again = training_cache(dg.build_asset_context(), project=project)
    assert again.metadata["noop"] and again.metadata["num_shards_packed"] == 0
    store = open_cache_store(project.config())
    assert list_versions(store) == [1]
    manifest = read_snapshot(store, 1).manifest
    assert manifest.schema_name == "gc25d_training_cache_v1"
    split_of = {e.id: e.split for sh in manifest.shards for e in sh.samples}
    assert split_of == {  # the SPEC's run-level split
        "arena__R10_s1512__000000": "val",
        "arena__R10_s1512__000096": "val",
        "arena__R10_s2024__000000": "train",
        "arena__R10_s2024__000096": "train",
    }


def test_training_cache_fails_when_the_publisher_rejects_a_receipt(project, tmp_path):
    training_cache(dg.build_asset_context(), project=project)
    # another worker's receipt that lists its val-run sample under a train run: must fail loudly
    scratch = LocalStore(tmp_path / "scratch")
    sid = "arena__R10_s1512__009600"
    tensors = {
        "latent": torch.zeros(48, 21, 4, 8, dtype=torch.bfloat16),
        "actions_block": torch.zeros(21, 5, dtype=torch.uint8),
    }
    meta = {"clip_id": sid, "subset": "s", "scene": "arena", "run": "R10_s1512", "start": 9600}
    res = pack_shard(
        scratch,
        worker="other",
        name="y",
        samples=[(sid, tensors, {**meta, "prompts": ["p"] * 21})],
        schema=SCHEMA_GC25D,
    )
    receipt = json.loads(scratch.read_bytes(res.receipt_path, scratch.head()))
    receipt["samples"][0]["group"] = "R10_s2024"
    store = open_cache_store(project.config())
    store.commit(
        {
            res.shard_path: (scratch.root / res.shard_path).read_bytes(),
            res.receipt_path: json.dumps(receipt).encode(),
        },
        parent=store.head(),
    )
    with pytest.raises(dg.Failure, match=res.receipt_path) as raised:
        training_cache(dg.build_asset_context(), project=project)
    assert f"sample {sid}" in str(raised.value) and "split group 'R10_s2024' is listed" in str(raised.value)
    assert res.receipt_path in raised.value.metadata["rejected"].data
    assert list_versions(store) == [1]


def test_sensor_adds_one_partition_and_run_per_new_snapshot(project, tmp_path):
    with dg.instance_for_test() as instance:
        assert isinstance(_tick(instance, project, None), dg.SkipReason)  # nothing published yet
        training_cache(dg.build_asset_context(), project=project)
        result = _tick(instance, project, None)
        assert [r.partition_key for r in result.run_requests] == ["v000001"]
        assert [r.run_key for r in result.run_requests] == ["v000001"]
        assert result.dynamic_partitions_requests[0].partition_keys == ["v000001"]
        assert result.cursor == "1"
        assert isinstance(_tick(instance, project, "1"), dg.SkipReason)
        # more clips arrive → the next snapshot, and only it is requested
        _write_clips(project.config(), {"R10_s1512": "val", "R10_s2024": "train", "R10_s3036": "train"})
        assert training_cache(dg.build_asset_context(), project=project).metadata["snapshot"] == "v000002"
        result = _tick(instance, project, "1")
        assert [r.partition_key for r in result.run_requests] == ["v000002"] and result.cursor == "2"


def test_snapshot_partition_is_verified_and_corruption_fails(project, tmp_path):
    training_cache(dg.build_asset_context(), project=project)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        result = dg.materialize(
            [cache_snapshot], partition_key="v000001", instance=instance, resources={"project": project}
        )
        assert result.success
        md = result.asset_materializations_for_node("cache_snapshot")[0].metadata
        assert md["num_shards"].value == 2 and md["verified_samples"].value == 4
        assert md["schema"].value == "gc25d_training_cache_v1"
        tars = sorted((tmp_path / "cache").rglob("*.tar"))
        assert tars
        data = bytearray(tars[0].read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte in a listed shard
        tars[0].chmod(0o644)
        tars[0].write_bytes(bytes(data))
        bad = dg.materialize(
            [cache_snapshot],
            partition_key="v000001",
            instance=instance,
            resources={"project": project},
            raise_on_error=False,
        )
        assert not bad.success
        failure = [e for e in bad.all_events if e.event_type_value == "STEP_FAILURE"][0]
        assert "v000001 failed verification" in failure.event_specific_data.error.message


def test_snapshots_hang_off_the_publisher_in_the_lineage():
    """training_cache → cache_snapshot: the edge the UI shows is the one runs are ordered by."""
    assert cache_snapshot.asset_deps[cache_snapshot.key] == {training_cache.key}


def test_cli_sync_snapshots_registers_every_published_snapshot(project, monkeypatch):
    from gc25d_pipeline.cli import sync_snapshots

    monkeypatch.setenv("GC25D_PRESET", project.preset)
    monkeypatch.setenv(
        "GC25D_OVERRIDES", ";".join([*project.overrides, f"paths.data_root={project.store.data_root}"])
    )
    training_cache(dg.build_asset_context(), project=project)
    with dg.instance_for_test() as instance:
        assert sync_snapshots(instance) == ["v000001"]
        assert sync_snapshots(instance) == ["v000001"]  # idempotent
        assert instance.get_dynamic_partitions("cache_snapshots") == ["v000001"]


def test_cli_launch_queues_a_run_and_prints_its_id(project, monkeypatch, tmp_path, capsys):
    from gc25d_pipeline.cli import main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
    assert main(["launch", "sft_job", "v000001"]) == 0
    run_id = capsys.readouterr().out.strip()
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
    assert run is not None and run.job_name == "sft_job" and run.tags["dagster/partition"] == "v000001"
    assert run.status == dg.DagsterRunStatus.QUEUED  # the daemon of dg dev starts it
    with pytest.raises(SystemExit, match="partition 'v000002' does not exist"):
        main(["launch", "sft_job", "v000002"])
