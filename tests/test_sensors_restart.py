"""The sensors on an instance that already holds results (`make dev` after `make run`): a partition
whose assets are materialized is not launched again, even with an empty cursor (a fresh daemon).

Real ephemeral instances; the materializations come from real runs of tiny stand-in assets with the
project's asset keys and partitions (dg.materialize), so the records are the ones a run writes."""

import json

import dagster as dg

from gc25d_pipeline.definitions import defs
from gc25d_pipeline.defs.cache.assets import training_cache
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.defs.cache.sensors import cache_snapshot_sensor
from gc25d_pipeline.defs.eval.sensors import PICK_TAG, teacher_pick_sensor

from .test_cache_pipeline import cache_project  # noqa: F401 (the `project` fixture)

CHAIN = ["stage1_tf", "stage2_cd", "stage3_dmd", "deploy_export", "eval"]


def _stand_ins() -> list[dg.AssetsDefinition]:
    """No-op assets with the keys, edges and partitions of the snapshot chain."""
    graph = defs.resolve_asset_graph()
    out = []
    for name in ["cache_snapshot", "sft", "sft_teacher", *CHAIN]:
        node = graph.get(dg.AssetKey(name))
        assert node.partitions_def == cache_snapshots, name

        @dg.asset(
            name=name,
            partitions_def=cache_snapshots,
            deps=[p for p in node.parent_keys if graph.get(p).partitions_def == cache_snapshots],
            config_schema={"pick": dg.Field(str, default_value="")},
        )
        def _a(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            pick = context.op_execution_context.op_config["pick"]
            return dg.MaterializeResult(data_version=dg.DataVersion(pick) if pick else None)

        out.append(_a)
    return out


STAND_INS = _stand_ins()


def _materialize(instance, partition: str, names: list[str], pick: str = "") -> None:
    config = {"ops": {"sft_teacher": {"config": {"pick": pick}}}} if "sft_teacher" in names else None
    result = dg.materialize(
        STAND_INS, instance=instance, partition_key=partition, selection=names, run_config=config
    )
    assert result.success


def _tick(instance, cursor=None) -> tuple[list[dg.RunRequest], str]:
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def())
    result = teacher_pick_sensor(ctx)
    assert isinstance(result, dg.SensorResult) and result.cursor is not None
    return list(result.run_requests or []), result.cursor


def _selected(request: dg.RunRequest) -> list[str]:
    return [k.to_user_string() for k in request.asset_selection or []]


def test_a_chain_materialized_after_its_pick_is_not_launched_again():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        # what `make run` leaves: the whole snapshot chain, in order, in-process
        _materialize(instance, "v000001", ["cache_snapshot", "sft", "sft_teacher"], pick="step-10-aaaa")
        _materialize(instance, "v000001", CHAIN)
        requests, cursor = _tick(instance)  # a fresh daemon: no cursor
        assert requests == []
        assert json.loads(cursor)["started"] == {"v000001": "step-10-aaaa"}
        assert _tick(instance, cursor)[0] == []
        # a new pick of the same snapshot: its chain is not done, all of it runs
        _materialize(instance, "v000001", ["sft_teacher"], pick="step-12-bbbb")
        (request,), cursor = _tick(instance, cursor)
        assert request.run_key == "v000001:step-12-bbbb" and request.tags[PICK_TAG] == "step-12-bbbb"
        assert _selected(request) == CHAIN


def test_a_chain_that_stopped_part_way_runs_only_what_is_missing():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001", "v000002"])
        _materialize(instance, "v000001", ["sft_teacher"], pick="step-10-aaaa")
        _materialize(instance, "v000001", ["stage1_tf", "stage2_cd"])
        # on v000002 stage 1 is older than the pick (an earlier teacher's): everything is stale
        _materialize(instance, "v000002", ["stage1_tf", "stage2_cd", "stage3_dmd"])
        _materialize(instance, "v000002", ["sft_teacher"], pick="step-20-cccc")
        requests, _ = _tick(instance)
        by_partition = {r.partition_key: _selected(r) for r in requests}
        assert by_partition == {"v000001": ["stage3_dmd", "deploy_export", "eval"], "v000002": CHAIN}


def test_an_asset_rebuilt_after_its_downstream_makes_the_downstream_run_again():
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        _materialize(instance, "v000001", ["sft_teacher"], pick="step-10-aaaa")
        _materialize(instance, "v000001", CHAIN)
        _materialize(instance, "v000001", ["stage2_cd"])  # rebuilt: stage 3 on read an older one
        (request,), _ = _tick(instance)
        assert _selected(request) == ["stage3_dmd", "deploy_export", "eval"]


def test_a_verified_snapshot_gets_its_partition_but_no_run(project):
    training_cache(dg.build_asset_context(), project=project)  # publishes v000001
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])  # as `make run` syncs it
        _materialize(instance, "v000001", ["cache_snapshot"])  # and verifies it in-process
        with dg.build_sensor_context(instance=instance, resources={"project": project}) as ctx:
            result = cache_snapshot_sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        assert result.run_requests == [] and result.cursor == "1"
        assert result.dynamic_partitions_requests == []  # known already
