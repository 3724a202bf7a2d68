"""The deploy export: the SPEC §6 file with its causal metadata and init chain, and the Dagster
asset that writes it between stage 3 and eval, with its contract check through the runtime loader."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from gc25d_core.deploy.export import write_deploy_export
from gc25d_core.deploy.runtime import FULL_SIZE_KEYS, contract_problems, load_deploy_model
from gc25d_core.handoff import handoff_of, read_handoff, write_handoff_file
from gc25d_core.hashing import sha256_file
from gc25d_core.models.export import read_export
from tests.deploy.conftest import write_tiny_export


def _chain(tmp_path: Path) -> Path:
    s1 = write_tiny_export(tmp_path / "s1.safetensors", stage="stage1_tf")
    s2 = write_tiny_export(
        tmp_path / "s2.safetensors",
        stage="stage2_cd",
        init_ckpt=json.dumps({"path": str(s1), "sha256": sha256_file(s1)}),
    )
    return write_tiny_export(
        tmp_path / "s3.safetensors",
        stage="stage3_dmd",
        init_ckpt=json.dumps({"path": str(s2), "sha256": sha256_file(s2)}),
    )


def test_deploy_export_keeps_the_causal_metadata_and_the_init_chain(tmp_path):
    s3 = _chain(tmp_path)
    summary = write_deploy_export(
        s3, tmp_path / "deploy.safetensors", expected_sha256=sha256_file(s3), runs_root=tmp_path
    )
    sd, meta = read_export(tmp_path / "deploy.safetensors")
    src, _ = read_export(s3)
    assert set(sd) == set(src) and all(v.dtype == src[k].dtype for k, v in sd.items())
    assert meta.causal is not None and (meta.causal.sink, meta.causal.window, meta.causal.rope_cap) == (
        3,
        17,
        20,
    )
    assert len(meta.denoise_axis or ()) == 4 and meta.vocab == "parts" and meta.data == "v10"
    chain = json.loads(meta.extra["init_chain"])
    assert (
        [c["stage"] for c in chain]
        == ["stage2_cd", "stage1_tf"]
        == [c["stage"] for c in summary["init_chain"]]
    )
    assert json.loads(meta.extra["deploy_source"])["sha256"] == sha256_file(s3)
    model, m = load_deploy_model(tmp_path / "deploy.safetensors", vocab="parts", strict_contract=False)
    assert contract_problems(m, len(model.state_dict())) == []  # tiny: no 831-key rule


def test_contract_names_what_is_off(tmp_path):
    _, meta = read_export(write_tiny_export(tmp_path / "a.safetensors"))
    assert any(
        f"a full-size export has {FULL_SIZE_KEYS}" in p for p in contract_problems(meta, 830, full_size=True)
    )
    off = meta.model_copy(
        update={"causal": meta.causal.model_copy(update={"window": 9}), "denoise_axis": (1000.0,)}
    )
    problems = contract_problems(off, 10)
    assert any("window=9" in p for p in problems) and any("4 steps" in p for p in problems)


def _materialize_deploy(tmp_path: Path, source: Path) -> dg.ExecuteInProcessResult:
    """deploy_export of a stage-3 hand-off naming ``source`` (inside the runs root), through a
    one-node torchrun launcher."""
    from gc25d_pipeline.defs.deploy.assets import deploy_export
    from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
    from gc25d_pipeline.lib.torchrun import TorchrunLauncher

    run = tmp_path / "runs" / "stage3_dmd" / "v000001"
    run.mkdir(parents=True)
    write_handoff_file(
        run / "final.json", handoff_of("stage3_dmd", 5, source, source, runs_root=tmp_path / "runs")
    )
    project = Gc25dProject(preset="tiny", store=ArtifactStore(runs_root=str(tmp_path / "runs")))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        return dg.materialize(
            [deploy_export],
            partition_key="v000001",
            instance=instance,
            resources={"project": project, "torchrun": TorchrunLauncher(nproc_per_node=2)},
            raise_on_error=False,
        )


def test_deploy_export_asset_and_its_check(tmp_path):
    s3 = _chain(tmp_path / "runs" / "exports")  # a hand-off names exports inside its runs root
    result = _materialize_deploy(tmp_path, s3)
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [("deploy_contract", True)]
    out = tmp_path / "runs" / "deploy_export" / "v000001"
    handoff = read_handoff(out / "final.json", tmp_path / "runs")
    assert handoff.stage == "deploy" and handoff.export == (out / "deploy.safetensors").resolve()
    assert (
        json.loads((out / "final.json").read_text())["export"] == "deploy_export/v000001/deploy.safetensors"
    )
    mat = result.asset_materializations_for_node("deploy_export")[0]
    assert mat.metadata["sha256"].value == handoff.sha256
    assert mat.metadata["keys"].value == len(read_export(s3)[0])
    assert [c["stage"] for c in mat.metadata["init_chain"].value] == ["stage2_cd", "stage1_tf"]
    # the job ran under torchrun (one rank, whatever the launcher's nproc_per_node) and wrote the summary
    summary = json.loads((out / "deploy.json").read_text())
    assert summary["sha256"] == handoff.sha256
    # its paths relative to the runs root, which can move
    assert summary["path"] == "deploy_export/v000001/deploy.safetensors"
    assert summary["source_path"] == "exports/s3.safetensors"
    assert list((out / "torchrun_logs" / "attempt-00").iterdir())


def test_a_bad_source_export_fails_the_step_once_naming_it(tmp_path):
    """A bidirectional export cannot be deployed: the job's ExportError fails the step at once (no
    retry: the same file fails the same way) and names the source."""
    bidirectional = write_tiny_export(tmp_path / "runs" / "exports" / "sft.safetensors", causal=False)
    result = _materialize_deploy(tmp_path, bidirectional)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message
    assert "ExportError" in message and "causal=false" in message and "stage3_dmd (ema)" in message
    assert "not retried" in message
    assert not (tmp_path / "runs" / "deploy_export" / "v000001" / "final.json").exists()


def test_deploy_export_sits_between_stage3_and_eval():
    from gc25d_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("stage3_dmd") in graph.get(dg.AssetKey("deploy_export")).parent_keys
    assert dg.AssetKey("deploy_export") in graph.get(dg.AssetKey("eval")).parent_keys


def test_eval_leaves_out_a_deploy_copy_of_an_export_it_evaluates(tmp_path):
    """The deploy export is stage 3's EMA with more metadata (another file hash, the same weights):
    eval scores it only when its source is not among the evaluated exports."""
    from gc25d_core.eval.run import without_deployed_copies
    from gc25d_core.eval.spec import EvalExport
    from gc25d_core.models.export import deployed_from

    s3 = _chain(tmp_path)
    deployed = tmp_path / "deploy.safetensors"
    write_deploy_export(s3, deployed)
    assert deployed_from(deployed) == sha256_file(s3) and deployed_from(s3) is None
    ema = EvalExport("stage3_dmd_ema", s3, sha256_file(s3), "stage3_dmd", 10)
    dep = EvalExport("deploy", deployed, sha256_file(deployed), "deploy", 10)
    kept, skipped = without_deployed_copies([ema, dep], [])
    assert [e.label for e in kept] == ["stage3_dmd_ema"]
    assert skipped == ["deploy: the same weights as stage3_dmd_ema (its deploy copy)"]
    kept, skipped = without_deployed_copies([dep], [])  # its source not evaluated: the copy is
    assert [e.label for e in kept] == ["deploy"] and skipped == []


def test_the_init_chain_is_followed_inside_the_runs_root_after_each_hash(tmp_path):
    """init_ckpt names a file relative to the runs root; one outside it is not read, and one whose
    bytes are not the recorded ones ends the chain before its header is parsed."""
    from gc25d_core.deploy.export import init_chain

    runs = tmp_path / "runs"
    s1 = write_tiny_export(runs / "stage1_tf" / "s1.safetensors", stage="stage1_tf")
    ref = {"path": "stage1_tf/s1.safetensors", "sha256": sha256_file(s1)}
    (item,) = init_chain({"init_ckpt": json.dumps(ref)}, runs)
    assert item["found"] and item["stage"] == "stage1_tf"
    outside = write_tiny_export(tmp_path / "s0.safetensors", stage="sft")
    for name in ("../s0.safetensors", str(outside)):
        (item,) = init_chain({"init_ckpt": json.dumps({"path": name, "sha256": sha256_file(outside)})}, runs)
        assert not item["found"] and "stage" not in item
    (item,) = init_chain({"init_ckpt": json.dumps({**ref, "sha256": "0" * 64})}, runs)
    assert item["found"] and item["sha256_ok"] is False and "stage" not in item
    assert init_chain({"init_ckpt": json.dumps(ref)}) == [{**ref, "found": False}]  # no runs root
