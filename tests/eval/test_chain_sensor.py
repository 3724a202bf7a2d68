"""teacher_pick_sensor: one distill_chain_job run per new sft_teacher pick of a partition, never two
at once for one partition (Dagster's sensor test utilities on a test instance)."""

import json

import dagster as dg
from dagster._core.test_utils import create_run_for_test

from gc25d_pipeline.defs.eval.sensors import CHAIN_JOB, PICK_TAG, teacher_pick_sensor


def _pick(instance: dg.DagsterInstance, partition: str, version: str) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization("sft_teacher", partition=partition, tags={"dagster/data_version": version})
    )


def _tick(instance: dg.DagsterInstance, cursor: str | None) -> tuple[list[dg.RunRequest], str]:
    from gc25d_pipeline.definitions import defs

    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def())
    result = teacher_pick_sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    assert result.cursor is not None
    return list(result.run_requests or []), result.cursor


def test_the_chain_starts_once_per_new_pick():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001", "v000002"])
        requests, cursor = _tick(instance, None)
        assert requests == []  # no pick yet

        _pick(instance, "v000001", "step-10-aaaa")
        requests, cursor = _tick(instance, cursor)
        assert [(r.partition_key, r.run_key, r.tags[PICK_TAG]) for r in requests] == [
            ("v000001", "v000001:step-10-aaaa", "step-10-aaaa")
        ]
        assert _tick(instance, cursor)[0] == []  # nothing new: nothing starts

        _pick(instance, "v000001", "step-10-aaaa")  # the same pick re-materialized
        requests, cursor = _tick(instance, cursor)
        assert requests == []

        _pick(instance, "v000001", "step-12-bbbb")  # a new pick of the same snapshot
        _pick(instance, "v000002", "step-10-cccc")  # and a first pick of another
        requests, cursor = _tick(instance, cursor)
        assert sorted(r.run_key for r in requests) == ["v000001:step-12-bbbb", "v000002:step-10-cccc"]
        assert _tick(instance, cursor)[0] == []


def test_a_pick_waits_while_its_partition_has_a_chain_running():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001", "v000002"])
        running = create_run_for_test(
            instance,
            job_name=CHAIN_JOB,
            tags={"dagster/partition": "v000001"},
            status=dg.DagsterRunStatus.STARTED,
        )
        _pick(instance, "v000001", "step-10-aaaa")
        _pick(instance, "v000001", "step-12-bbbb")  # supersedes the first while it waits
        _pick(instance, "v000002", "step-10-cccc")  # another partition is not held up
        requests, cursor = _tick(instance, None)
        assert [r.run_key for r in requests] == ["v000002:step-10-cccc"]
        assert json.loads(cursor)["pending"]["v000001"][0] == "step-12-bbbb"
        assert _tick(instance, cursor)[0] == []  # still running

        instance.report_run_failed(running)  # the chain ended (any way): the newest pick starts
        requests, cursor = _tick(instance, cursor)
        assert [r.run_key for r in requests] == ["v000001:step-12-bbbb"]
        assert _tick(instance, cursor)[0] == []


def test_the_chain_job_and_its_sensor_are_in_the_code_location():
    from gc25d_pipeline.definitions import defs

    chain = defs.resolve_job_def(CHAIN_JOB)
    assert {n.name for n in chain.graph.node_defs} == {
        "stage1_tf",
        "stage2_cd",
        "stage3_dmd",
        "deploy_export",
        "eval",
    }
    assert {n.name for n in defs.resolve_job_def("sft_job").graph.node_defs} == {"sft", "sft_teacher"}
    assert defs.resolve_sensor_def("teacher_pick_sensor").job_name == CHAIN_JOB
