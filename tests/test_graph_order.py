"""What a user can click in the UI runs in a correct order: the graph orders publish → verify → train,
a partition without a published snapshot is refused before anything launches, and errors that cannot
succeed on a retry fail once."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from gc25d_core.cache.snapshots import list_versions
from gc25d_core.cache.stores import open_cache_store
from gc25d_pipeline.definitions import defs
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.launcher import JobLauncher, rank_failure
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject

from .test_cache_pipeline import _write_clips

# what the fake launcher saw at each launch: (asset, snapshots published at that moment)
LAUNCHES: list[tuple[str, list[int]]] = []


class _Launched:
    def get_materialize_result(self) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"fake": True})


class RecordingLauncher(JobLauncher):
    """Launches nothing; records which snapshots were published when a stage would have started."""

    def launch(self, context, module, cfg, run_dir, args=None, extras=None):  # type: ignore[override]
        LAUNCHES.append((context.asset_key.to_user_string(), list_versions(open_cache_store(cfg))))
        return _Launched()


@pytest.fixture
def project(tmp_path: Path) -> Gc25dProject:
    (tmp_path / "data").mkdir()  # a data root the user names must exist (config.check_given_roots)
    p = Gc25dProject(
        preset="tiny",
        overrides=[f"cache.store={tmp_path / 'cache'}", "cache.samples_per_shard=2"],
        store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs")),
    )
    _write_clips(p.config(), {"R10_s1512": "val", "R10_s2024": "train"})
    LAUNCHES.clear()
    return p


def _step_levels(job: dg.JobDefinition) -> dict[str, int]:
    from dagster._core.execution.api import create_execution_plan

    plan = create_execution_plan(job)
    return {
        step.key: level for level, steps in enumerate(plan.get_steps_to_execute_by_level()) for step in steps
    }


def test_whole_graph_orders_publish_before_verify_before_training():
    """The whole graph as one run (what "Materialize all" plans): every step on a snapshot partition
    comes after training_cache, and training after the snapshot's verification."""
    graph = defs.resolve_asset_graph()
    on_snapshots = [k for k in graph.get_all_asset_keys() if graph.get(k).partitions_def == cache_snapshots]
    assert {"cache_snapshot", "sft", "sft_teacher", "stage1_tf"} <= {k.to_user_string() for k in on_snapshots}
    for key in on_snapshots:
        assert dg.AssetKey("training_cache") in graph.get_ancestor_asset_keys(key), key
        if key != dg.AssetKey("cache_snapshot"):
            assert dg.AssetKey("cache_snapshot") in graph.get_ancestor_asset_keys(key), key
    levels = _step_levels(defs.resolve_implicit_global_asset_job_def())
    assert levels["training_cache"] < levels["cache_snapshot"] < levels["sft"] < levels["sft_teacher"]
    assert levels["sft_teacher"] < levels["stage1_tf"] < levels["stage2_cd"] < levels["stage3_dmd"]


def test_a_run_selected_from_the_whole_graph_trains_only_after_its_snapshot_exists(project):
    """A partition known to the instance before anything was published (what the user had): the run
    publishes, verifies, then launches sft, which then sees its snapshot."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(cache_snapshots.name, ["v000001"])
        result = dg.materialize(
            list(defs.assets or []),
            selection=["training_cache", "cache_snapshot", "sft"],
            partition_key="v000001",
            instance=instance,
            resources={"project": project, "torchrun": RecordingLauncher()},
        )
    assert result.success
    order = [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"]
    assert order == ["training_cache", "cache_snapshot", "sft"]
    assert LAUNCHES == [("sft", [1])]


def _single_failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    step_events = [ev.event_type_value for ev in result.all_events if ev.is_step_event]
    assert "STEP_UP_FOR_RETRY" not in step_events, step_events
    failures = [ev for ev in result.all_events if ev.is_step_failure]
    assert len(failures) == 1
    return failures[0].step_failure_data.error.message


@pytest.mark.parametrize("asset", ["sft", "cache_snapshot"])
def test_a_partition_without_a_snapshot_fails_once_before_launch(project, asset):
    """A key added by hand (nothing published, or not this version): refused up front, not retried,
    although sft's retry policy would retry a failed launch three times."""
    from gc25d_pipeline.defs.cache.assets import training_cache

    training_cache(dg.build_asset_context(), project=project)  # v000001 exists, v000007 does not
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(cache_snapshots.name, ["v000007"])
        result = dg.materialize(
            list(defs.assets or []),
            selection=[asset],
            partition_key="v000007",
            instance=instance,
            resources={"project": project, "torchrun": RecordingLauncher()},
            raise_on_error=False,
        )
    message = _single_failure(result)
    assert "partition v000007 has no snapshot behind it" in message and "v000001" in message
    assert LAUNCHES == []


def _error_file(log_dir: Path, message: str) -> None:
    path = log_dir / "node-0" / "run" / "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    extra = {"py_callstack": "Traceback ...", "timestamp": "1"}
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))


@pytest.mark.parametrize(
    ("message", "retried"),
    [
        ("ConfigError: sft.lr: Input should be a valid number", False),
        ("ManifestError: manifests/v000001.json says version 2", False),
        ("RuntimeError: CUDA out of memory", True),
        ("DistNetworkError: Connection reset by peer", True),
    ],
)
def test_rank_errors_of_the_inputs_are_not_retried(tmp_path, message, retried):
    _error_file(tmp_path, message)
    context = SimpleNamespace(log=SimpleNamespace(error=lambda *_: None))
    failure = rank_failure(context, "gc25d_core.jobs.sft", tmp_path, "torchrun failed")  # type: ignore[arg-type]
    assert failure.allow_retries is retried
    assert message in (failure.description or "")
