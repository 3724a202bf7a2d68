"""A tiny end-to-end evaluation: random causal (stage-1-like) and bidirectional (SFT-like) exports on
a tiny world with extensions, the same cases for both, reports on disk, and the Dagster asset."""

import json
import math
import shutil
from pathlib import Path

import dagster as dg
import pytest
import torch

from gc25d_core.eval.evaluate import (
    EvalConfig,
    Reference,
    evaluate_export,
    exports_of_handoff,
    load_cases,
    vae_decoder,
)
from gc25d_core.eval.report import write_reports
from gc25d_core.handoff import FINAL, TEACHER, read_handoff
from tests.eval.world import eval_world
from tests.train.world import random_teacher

# shorter sweeps than the definition (28 / 61 cells) keep CPU CI fast; 27 chain cells still reach
# the second clip's ground truth (cells 25, 26)
FAST = EvalConfig(clip28_clips=1, chain241_chains=1, clip28_cells=24, chain241_cells=27, teacher_steps=2)


def toy_decode(latents: torch.Tensor) -> torch.Tensor:
    """A fixed stand-in decoder: 3 channels, 4 frames per cell after the first, 16x upsampling."""
    x = torch.tanh(latents[:, :3].float()).repeat_interleave(4, dim=2)[:, :, 3:]
    return x.repeat_interleave(16, dim=3).repeat_interleave(16, dim=4)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_world")
    cfg = eval_world(root)
    return root, cfg, random_teacher(cfg, root, causal=True), random_teacher(cfg, root)


def _finite_or_null(obj) -> None:
    if isinstance(obj, dict):
        for v in obj.values():
            _finite_or_null(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite_or_null(v)
    elif isinstance(obj, float):
        assert math.isfinite(obj)


def test_causal_and_teacher_exports_answer_the_same_cases(world):
    root, cfg, stage1, teacher = world
    cases, clips = load_cases(cfg, FAST, None)
    (clip,) = cases["clip28"]
    (chain,) = cases["chain241"]
    assert clip.num_cells == 24 and chain.num_cells == 27
    assert [g for g in range(27) if not chain.has_gt[g]] == [21, 22, 23, 24]
    ref = Reference(clips, toy_decode)
    exports = exports_of_handoff("stage1_tf", stage1, root) + exports_of_handoff("sft", teacher, root)
    results = [evaluate_export(e, cfg, FAST, cases, ref) for e in exports]
    assert [r["sampler"]["kind"] for r in results] == ["causal", "teacher"]
    assert results[0]["sampler"]["denoise_axis"] == list(read_export_axis(stage1, root))
    for r in results:
        for sweep in ("clip28", "chain241"):
            s = r["sweeps"][sweep]
            assert s["num_cases"] == 1
            assert s["curves"]["latent_mse"][0] == 0.0  # the anchor is the ground truth's cell 0
            assert s["regions"]["1_20"]["latent_mse"] > 0 and s["regions"]["1_20"]["psnr"] < 100
    files = write_reports(root / "eval", results)
    for label in ("stage1_tf", "sft"):
        doc = json.loads((root / "eval" / label / "metrics.json").read_text())
        _finite_or_null(doc)
        assert doc["sweeps"]["chain241"]["curves"]["latent_mse"][22] is None  # no ground truth there
        assert (root / "eval" / label / "clip28_strip.png").is_file()
    assert (root / "eval" / "chain241_latent_mse.png").read_bytes()[:4] == b"\x89PNG"
    assert "| stage1_tf |" in files.table and "| sft |" in files.table
    assert "chain241_psnr.png" in (root / "eval" / "report.md").read_text()
    assert not list((root / "eval").rglob(".tmp-*"))


@pytest.mark.parametrize("kind", ["stage1_tf", "sft"])
def test_a_batch_of_rows_rolls_out_each_row_as_it_would_alone(world, kind):
    """The own and the swapped conditioning run as one batch: each row draws the noise it would draw
    alone from its own generator, and its latents are the single rollout's up to the batched
    kernels' rounding (and not another row's: the rows differ)."""
    from gc25d_core.eval.evaluate import build_sampler
    from gc25d_core.hashing import seed_int

    root, cfg, stage1, teacher = world
    cases, _ = load_cases(cfg, FAST, None)
    (case,) = cases["clip28"]
    (export,) = exports_of_handoff(kind, stage1 if kind == "stage1_tf" else teacher, root)
    sampler = build_sampler(export, cfg, FAST, torch.device("cpu"))
    seed = seed_int(FAST.seed, "clip28", case.case_id)

    def gens(n: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(seed) for _ in range(n)]

    rows = [(case.ids, case.keys), (case.other_ids, case.other_keys)]
    alone = [sampler(case.anchor[None], i[None], [k], case.num_cells, gens(1))[0] for i, k in rows]
    both = sampler(
        case.anchor[None].repeat(2, 1, 1, 1, 1),
        torch.stack([i for i, _ in rows]),
        [k for _, k in rows],
        case.num_cells,
        gens(2),
    )
    for got, want in zip(both, alone, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (alone[0] - alone[1]).abs().max() > 1e-3


def read_export_axis(handoff: Path, runs_root: Path) -> tuple[float, ...]:
    from gc25d_core.models.export import read_export

    _, meta = read_export(read_handoff(handoff, runs_root).export)
    assert meta.denoise_axis is not None
    return meta.denoise_axis


def test_identical_rollouts_score_zero_error(world):
    """A 'sampler' that returns the ground truth where it exists: zero latent error, capped PSNR."""
    root, cfg, stage1, _ = world
    cases, clips = load_cases(cfg, FAST, None)
    ref = Reference(clips, toy_decode)

    class Oracle:
        def describe(self):
            return {"kind": "oracle"}

        def __call__(self, anchor, ids, keys, num_cells, gens):
            (case,) = [c for cs in cases.values() for c in cs if c.num_cells == num_cells]
            return ref.latents(case)[None].repeat(len(gens), 1, 1, 1, 1)

    (export,) = exports_of_handoff("oracle", stage1, root)
    r = evaluate_export(export, cfg, FAST, cases, ref, sampler=Oracle())
    for sweep in ("clip28", "chain241"):
        reg = r["sweeps"][sweep]["regions"]["1_20"]
        assert reg["latent_mse"] == 0.0 and reg["psnr"] == 100.0 and reg["delta_psnr"] == 0.0


def test_the_tiny_vae_decoder_keeps_the_contract():
    from gc25d_core.models.vae import build_vae

    torch.manual_seed(0)
    vae, z = build_vae(tiny=True), torch.randn(1, 48, 2, 1, 2)
    frames = vae_decoder(vae)(z)
    assert frames.shape == (1, 3, 5, 16, 32) and frames.abs().max() <= 1.0
    # through the VAE interface, the same numbers as DiffSynth's own batched decode (eval's
    # earlier path into the VAE's internals): the eval tables do not move
    with torch.no_grad():
        assert torch.equal(frames, vae.model.decode(z, vae.scale).clamp(-1, 1))


def test_report_files_are_written_atomically(world, monkeypatch):
    """A crash while writing leaves the previous report whole and no temp file behind."""
    import gc25d_core.atomic as atomic

    root = world[0]
    out = root / "atomic"
    result = {"export": {"label": "x", "step": 1}, "sampler": {"kind": "causal"}, "sweeps": {}}
    write_reports(out, [result])
    before = (out / "report.md").read_text()
    calls = {"n": 0}
    real = atomic.os.replace

    def crash(src, dst):
        calls["n"] += 1
        if Path(dst).name == "report.md":
            raise OSError("disk gone")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_reports(out, [{**result, "export": {"label": "y", "step": 2}}])
    assert calls["n"] > 1 and (out / "report.md").read_text() == before
    assert not list(out.rglob(".tmp-*"))


def test_eval_asset_evaluates_what_exists(world):
    """The asset launches the eval job (one rank) and describes what it wrote."""
    from gc25d_pipeline.defs.eval.assets import eval_asset
    from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject
    from gc25d_pipeline.lib.torchrun import TorchrunLauncher

    root, cfg, stage1, teacher = world
    runs = root  # the world's runs root: the hand-offs name exports inside it
    for handoff, folder in (
        (teacher, runs / "sft" / "v000001" / TEACHER),
        (stage1, runs / "stage1_tf" / "v000001" / FINAL),
    ):
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(handoff, folder)
    project = Gc25dProject(
        preset="tiny",
        # the live session encodes and decodes: the seeded random tiny VAE (no tiny_vae asset here)
        overrides=[f"cache.store={cfg.cache.store}", "vae.fit.enabled=false"],
        store=ArtifactStore(data_root=str(cfg.paths.data_root), runs_root=str(runs)),
    )
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("cache_snapshots", ["v000001"])
        result = dg.materialize(
            [eval_asset],
            partition_key="v000001",
            instance=instance,
            resources={"project": project, "torchrun": TorchrunLauncher()},
            run_config={
                "ops": {
                    "eval": {
                        "config": {
                            "clip28_clips": 1,
                            "chain241_chains": 0,
                            "teacher_steps": 1,
                            "decode": False,
                            # the embedded default's live240, shortened: the causal export's session
                            "live_cells": 4,
                        }
                    }
                }
            },
        )
    assert result.success
    (mat,) = result.asset_materializations_for_node("eval")
    md = mat.metadata
    assert md["exports"].value == ["sft", "stage1_tf"]
    assert any("stage2_cd" in s for s in md["not_evaluated"].value)
    assert list(md)[:2] == ["table", "plot"]
    assert [r.data["export"] for r in md["table"].records] == ["sft", "stage1_tf"]
    assert md["plot"].value.startswith("**clip28 latent mse per cell**")
    assert (runs / "eval" / "v000001" / "stage1_tf" / "metrics.json").is_file()
    assert md["world_size"].value == 1  # reported by the job's rank 0 through Pipes
    assert "| stage1_tf |" in md["live_table"].value and "drift dB/min" in md["live_table"].value
    assert "stage1_tf/live240_drift" in md["drift"].value and "data:image/png;base64," in md["drift"].value
    assert md["computed"].value["live240"] == 3 and md["kept_rows"].value == []  # own, other, changed
