"""Every job's selection covers what its assets read: an asset a job materializes reads its parents'
outputs for the same partition, so a parent that is downstream of what the job changes must be
rematerialized in the same run, or the job's asset reads a stale (or missing) file. This is how
distill_chain_job once lost deploy_export (eval then reported the deploy export as not produced)."""

import re
from pathlib import Path

import dagster as dg
import pytest

from gc25d_pipeline.definitions import defs

ROOT = Path(__file__).resolve().parent.parent


def _graph():
    return defs.resolve_asset_graph()


def _jobs() -> list[dg.JobDefinition]:
    return [j for j in defs.get_repository_def().get_all_jobs() if not j.name.startswith("__")]


def _selected(job: dg.JobDefinition) -> set[dg.AssetKey]:
    return set(job.asset_layer.selected_asset_keys)


def stale_reads(graph, selected: set[dg.AssetKey]) -> dict[str, list[str]]:
    """asset of ``selected`` -> its parents (same partitioning) that are downstream of something
    ``selected`` materializes but are not selected themselves."""
    downstream: set[dg.AssetKey] = set()
    todo = [c for k in selected for c in graph.get(k).child_keys]
    while todo:  # everything a run of ``selected`` makes out of date
        key = todo.pop()
        if key not in downstream:
            downstream.add(key)
            todo += graph.get(key).child_keys
    out: dict[str, list[str]] = {}
    for key in selected:
        node = graph.get(key)
        missing = [
            p.to_user_string()
            for p in node.parent_keys
            if p in downstream and p not in selected and graph.get(p).partitions_def == node.partitions_def
        ]
        if missing:
            out[key.to_user_string()] = sorted(missing)
    return out


@pytest.mark.parametrize("job", _jobs(), ids=lambda j: j.name)
def test_every_job_covers_the_parents_its_assets_read(job: dg.JobDefinition):
    assert _selected(job), f"{job.name} selects no asset"
    assert stale_reads(_graph(), _selected(job)) == {}


def test_the_check_catches_a_job_that_skips_an_asset_in_the_middle():
    # the hand-kept list distill_chain_job had: eval reads deploy_export, which reads stage3_dmd
    old = {dg.AssetKey(k) for k in ("stage1_tf", "stage2_cd", "stage3_dmd", "eval")}
    assert stale_reads(_graph(), old) == {"eval": ["deploy_export"]}


def test_the_chain_job_is_everything_downstream_of_the_pick():
    graph = _graph()
    chain = {k.to_user_string() for k in _selected(defs.resolve_job_def("distill_chain_job"))}
    assert {"stage1_tf", "stage2_cd", "stage3_dmd", "deploy_export", "eval"} <= chain
    below_pick = {
        k.to_user_string()
        for k in dg.AssetSelection.assets("sft_teacher").downstream().resolve(graph)
        if k != dg.AssetKey("sft_teacher")
    }
    assert chain == below_pick
    # and its sensor starts that job; sft_job stops at the pick, so no stage runs in two jobs
    assert defs.resolve_sensor_def("teacher_pick_sensor").job_name == "distill_chain_job"
    sft = {k.to_user_string() for k in _selected(defs.resolve_job_def("sft_job"))}
    assert sft == {"sft", "sft_teacher"} and not sft & chain


def test_the_makefile_chain_selects_the_snapshot_and_everything_after_it():
    """`make run` launches $(CHAIN) for the new snapshot: the same assets as the snapshot's three jobs."""
    makefile = (ROOT / "Makefile").read_text()
    (chain,) = re.findall(r"^CHAIN\s*:=\s*(\S+)\s*$", makefile, re.M)
    launched = dg.AssetSelection.from_coercible(chain.split(",")).resolve(_graph())
    jobs = set().union(
        *(_selected(defs.resolve_job_def(j)) for j in ("cache_snapshot_job", "sft_job", "distill_chain_job"))
    )
    assert launched == jobs
