"""SPEC §5 preprocessing on the tiny code world: Dagster assets over 2 CPU ranks, layout validation,
and a job killed midway that resumes to identical outputs, rebuilding only unfinished clips."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import torch

from gc25d_core.config import load_config, write_resolved
from gc25d_core.index import build_and_write, read_index
from gc25d_core.layout import Layout, Shapes, read_cond, read_cond_ext, read_latents, read_meta, read_npz
from gc25d_core.vocab import valid_raw_ids
from gc25d_pipeline.defs.data.assets import clips_index, raw_source
from gc25d_pipeline.defs.prep.assets import clip_meta, cond, cond_ext, ext_canvas, latents, tiny_vae
from gc25d_pipeline.lib.project import ArtifactStore, Gc25dProject, RawDataset
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _cfg(tmp_path, raw_root):
    return load_config(
        "tiny",
        {
            "paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path / "runs")},
            "raw": {"root": str(raw_root)},
            "vae": {"fit": {"enabled": False}},  # these tests encode with the seeded random tiny VAE
        },
    )


def test_prep_assets_through_dagster_pass_the_layout_validators(tmp_path, tiny_raw):
    (tmp_path / "data").mkdir()  # a data root the user names must exist (config.check_given_roots)
    project = Gc25dProject(
        preset="tiny",
        # a token fit: the test is about the wiring (fit -> record -> latents -> preview), not quality
        overrides=["vae.fit.steps=2", "vae.fit.batch=1", "vae.fit.crop=32", "vae.fit.eval_frames=5"],
        store=ArtifactStore(data_root=str(tmp_path / "data"), runs_root=str(tmp_path / "runs")),
        raw=RawDataset(root=str(tiny_raw.root)),
    )
    resources = {"project": project, "torchrun": TorchrunLauncher(nproc_per_node=2)}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [raw_source, clips_index, tiny_vae, cond, clip_meta, cond_ext, ext_canvas, latents],
            instance=instance,
            resources=resources,
        )
        assert result.success
        again = dg.materialize([tiny_vae], instance=instance, resources=resources)
        assert again.success
        # the fit's file rewritten in place (another mtime): the job is launched, finds its inputs
        # unchanged and the file's SHA256 its record's, and keeps it
        fit_path = Path(project.config().paths.data_root) / "models" / "tiny_vae.safetensors"
        fit_path.write_bytes(fit_path.read_bytes())
        relaunched = dg.materialize([tiny_vae], instance=instance, resources=resources)
        (relaunch_md,) = [m.metadata for m in relaunched.asset_materializations_for_node("tiny_vae")]
        assert "launched" not in relaunch_md and relaunch_md["skipped"].value
        # nothing changed: the clip job's record stands and no job is launched
        rerun = dg.materialize([cond], instance=instance, resources=resources)
        (rerun_md,) = [m.metadata for m in rerun.asset_materializations_for_node("cond")]
        assert rerun_md["launched"].value is False and rerun_md["num_failed"].value == 0
        mats = {
            e.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
            for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION"
        }
    cfg = project.config()
    layout, shapes = Layout(cfg.paths.data_root), Shapes.of(cfg)
    rows = read_index(layout)
    ext_rows = [r for r in rows if r.has_ext]
    assert mats["cond"]["num_clips"].value == len(rows) and mats["cond"]["world_size"].value == 2
    assert mats["cond"]["num_failed"].value == 0 and "preview" in mats["cond"]
    assert mats["cond_ext"]["num_clips"].value == len(ext_rows) > 0
    for r in rows:
        ids = read_cond(layout, r.clip_id, shapes)
        assert set(np.unique(ids).tolist()) <= set(valid_raw_ids("parts"))
        assert set(np.unique(ids).tolist()) & {12, 13, 14, 15, 16}  # player parts were labelled
        meta = read_meta(layout, r.clip_id, shapes, r.has_ext)
        assert meta["world_to_clip"].shape[0] == (109 if r.has_ext else 81)
        if r.centered:  # the player is at the destination centre pixel on centred runs
            centre = (shapes.hw[0] // 2 - 1) * shapes.hw[1] + shapes.hw[1] // 2
            assert abs(int(meta["player_px"][0]) - centre) <= shapes.hw[1] + 1
    for r in ext_rows:
        ext = read_cond_ext(layout.cond_ext(r.clip_id), shapes)
        assert ext["prompts"].shape == (7,)
    canvas_rows = [r for r in rows if r.ext_look_change]
    assert mats["ext_canvas"]["num_built"].value == len(canvas_rows) > 0
    for r in canvas_rows:
        canvas = read_cond_ext(layout.cond_ext_canvas(r.clip_id), shapes)
        raw_ext = read_cond_ext(layout.cond_ext(r.clip_id), shapes)
        assert np.array_equal(canvas["blocks"], raw_ext["blocks"])
        assert (canvas["prompts"] == raw_ext["prompts"]).all()
    fit = mats["tiny_vae"]
    assert fit["used"].value and not fit["skipped"].value and fit["recon_mse_heldout"].value > 0
    refit = again.asset_materializations_for_node("tiny_vae")[0].metadata
    assert refit["skipped"].value and refit["sha256"].value == fit["sha256"].value  # same inputs: kept
    assert refit["launched"].value is False  # its job's record stands: no process started
    from gc25d_core.models.vae_fit import record_file

    record = record_file(cfg).read_text()  # names its file, not the data root it was written under
    assert json.loads(record)["path"] == "tiny_vae.safetensors" and str(tmp_path) not in record
    numerics = json.loads(record)["numerics"]  # the fit's process: its threads, tests/__init__.py's pins
    assert numerics["threads"] == cfg.vae.fit.threads and numerics["pins"]["MKL_CBWR"] == "AVX2,STRICT"
    from gc25d_core.preview import video_info

    video = video_info(mats["latents"]["preview_video"].value)
    assert (video["frames"], video["width"], video["height"]) == (81, 2 * 2 * 128, 2 * 64)
    assert "latents" in mats, sorted(mats)
    assert mats["latents"]["num_built"].value == len(rows) and mats["latents"]["num_failed"].value == 0
    for r in rows:
        rec = read_latents(layout.latents(r.clip_id), shapes)
        assert rec["latent"].shape == (48, 21, 4, 8) and rec["clip_id"] == r.clip_id
        assert torch.isfinite(rec["latent"].float()).all() and rec["latent"].float().std() > 0
        assert rec["prompts"][0] == rec["prompts"][1]  # cell 0 = cell 1


def _content_hashes(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.glob("*.npz")):
        h = hashlib.sha256()
        for key, arr in sorted(read_npz(path).items()):
            h.update(key.encode() + arr.tobytes())
        out[path.name] = h.hexdigest()
    return out


def _run_job(
    cfg, run_dir: Path, fault: str | None = None, job: str = "gc25d_core.jobs.cond", ranks: int = 2
) -> subprocess.CompletedProcess:
    config_path = write_resolved(cfg, run_dir)
    cmd = TorchrunLauncher(nproc_per_node=ranks, python=sys.executable).command(
        job, ["--config", str(config_path), "--run-dir", str(run_dir)], run_dir / "logs"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GC25D_FAULT", None)
    if fault:
        env["GC25D_FAULT"] = fault
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _summary(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("{") and '"materialize"' in line:
            return json.loads(line)["metadata"]
    raise AssertionError(f"no materialization in output:\n{proc.stdout}\n{proc.stderr}")


def test_killed_cond_job_resumes_with_identical_outputs(tmp_path, tiny_raw):
    killed = _cfg(tmp_path / "killed", tiny_raw.root)
    build_and_write(tiny_raw.root, killed)
    num_clips = len(read_index(Layout(killed.paths.data_root)))
    # rank 0 dies hard (os._exit) when it reaches its 3rd clip: clips 1-2 of rank 0 are on disk
    proc = _run_job(killed, tmp_path / "killed" / "run", fault="rank=0,step=3,mode=exit")
    assert proc.returncode != 0
    cond_dir = killed.paths.data_root / "cond"
    before = {p.name: p.stat().st_mtime_ns for p in cond_dir.glob("*.npz")}
    assert 2 <= len(before) < num_clips
    assert not list(cond_dir.glob(".tmp-*")) or all(
        p.name.startswith(".tmp-") for p in cond_dir.iterdir() if not p.name.endswith(".npz")
    )
    proc = _run_job(killed, tmp_path / "killed" / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(proc)
    assert summary["num_skipped"] == len(before)  # finished clips were not recomputed
    assert summary["num_built"] == num_clips - len(before)
    assert {p.name: p.stat().st_mtime_ns for p in cond_dir.glob("*.npz") if p.name in before} == before

    clean = _cfg(tmp_path / "clean", tiny_raw.root)
    build_and_write(tiny_raw.root, clean)
    assert _run_job(clean, tmp_path / "clean" / "run").returncode == 0
    assert _content_hashes(cond_dir) == _content_hashes(clean.paths.data_root / "cond")
    assert len(_content_hashes(cond_dir)) == num_clips


def test_a_failing_clip_is_reported_and_fails_the_job(tmp_path, tiny_raw):
    cfg = _cfg(tmp_path, tiny_raw.root)
    build_and_write(tiny_raw.root, cfg)
    rows = sorted(read_index(Layout(cfg.paths.data_root)), key=lambda r: r.clip_id)
    # corrupt one frame's ids.png of the first clip: that clip fails, the others are still built
    run = tiny_raw.root / rows[0].subset / rows[0].scene / rows[0].run
    ids_png = run / "frames" / f"{rows[0].start + 5:06d}" / "ids.png"
    original = ids_png.read_bytes()
    try:
        ids_png.write_bytes(b"garbage")
        proc = _run_job(cfg, tmp_path / "run")
    finally:
        ids_png.write_bytes(original)
    assert proc.returncode != 0
    assert f"{rows[0].clip_id}" in proc.stderr and "ids.png" in proc.stderr
    failures = json.loads((tmp_path / "run" / "failures" / "rank-0.json").read_text())
    assert [f["clip_id"] for f in failures] == [rows[0].clip_id]
    assert len(list((cfg.paths.data_root / "cond").glob("*.npz"))) == len(rows) - 1


def test_latents_batches_group_decoded_clips_and_report_failed_ones():
    from gc25d_core.preprocess.latents import _clip_batches

    frames = torch.zeros(1)
    loader = [[(0, frames)], [(1, "OSError: bad png")], [(2, frames)], [(3, frames)], [(4, frames)]]
    errors: list[tuple[int, str]] = []
    groups = list(_clip_batches(loader, 2, lambda i, msg: errors.append((i, msg))))
    assert [[i for i, _ in g] for g in groups] == [[0, 2], [3, 4]]
    assert errors == [(1, "OSError: bad png")]
    assert [[i for i, _ in g] for g in _clip_batches(loader[:3], 4, lambda i, m: None)] == [[0, 2]]


def test_latents_batch_encoded_before_a_failure_is_still_written(tmp_path, tiny_raw, monkeypatch):
    """The job writes batch k while batch k+1 encodes; if k+1's encode raises, k is written anyway."""
    from gc25d_core.preprocess import latents as L

    cfg = _cfg(tmp_path, tiny_raw.root)
    cfg = cfg.model_copy(update={"vae": cfg.vae.model_copy(update={"num_workers": 0, "clips_per_batch": 1})})
    build_and_write(tiny_raw.root, cfg)
    layout = Layout(cfg.paths.data_root)
    rows = sorted(read_index(layout), key=lambda r: r.clip_id)[:3]
    real, calls = L.encode_batch, []

    def encode_then_fail(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(*a, **kw)

    monkeypatch.setattr(L, "encode_batch", encode_then_fail)
    done: list[str] = []
    with pytest.raises(RuntimeError, match="simulated"):
        L.run_latents(cfg, rows, torch.device("cpu"), lambda r, n: done.append(r.clip_id), lambda r, e: None)
    assert done == [rows[0].clip_id]
    read_latents(layout.latents(rows[0].clip_id), Shapes.of(cfg))  # complete and valid
    assert not layout.latents(rows[1].clip_id).exists()


def _fit_cfg(root: Path, raw_root: Path, **fit):
    """The tiny preset with a token tiny VAE fit (8 wide, 32² crops) under ``root``, its index written;
    ``fit``: more vae.fit settings."""
    fit = dict(enabled=True, batch=1, crop=32, eval_frames=5, dim=8, dec_dim=8) | fit
    over = {"paths": {"data_root": str(root)}, "raw": {"root": str(raw_root)}, "vae": {"fit": fit}}
    cfg = load_config("tiny", over)
    build_and_write(raw_root, cfg)
    return cfg


def test_the_tiny_vae_job_continues_its_fit_when_its_steps_are_raised(tmp_path, tiny_raw, one_thread):
    """The tiny_vae job keeps the fit's state beside the weights: raised from 2 steps to 3, it
    continues from step 2 and writes the weights a 3-step fit in one go writes (same SHA256)."""
    from gc25d_core.models.vae_fit import state_file
    from gc25d_core.preprocess.tiny_vae import run_fit
    from gc25d_core.report import StdoutReporter

    def cfg_of(root: Path, steps: int):
        return _fit_cfg(root, tiny_raw.root, steps=steps)

    rep = StdoutReporter(rank=0)
    short = run_fit(cfg_of(tmp_path / "a", 2), rep)
    assert short["resumed_from"] == 0 and state_file(cfg_of(tmp_path / "a", 2)).is_file()
    raised = run_fit(cfg_of(tmp_path / "a", 3), rep)
    whole = run_fit(cfg_of(tmp_path / "b", 3), rep)
    assert raised["resumed_from"] == 2 and whole["resumed_from"] == 0
    assert raised["sha256"] == whole["sha256"] != short["sha256"]


def test_a_two_phase_fit_goes_on_from_its_first_phase_and_keeps_it(tmp_path, tiny_raw, one_thread):
    """``vae.fit.then``: the first phase is the fit its settings give alone (same SHA256 as a job
    without ``then``), kept beside the weights; the warm phase goes on from it. Raised from 2 warm steps
    to 3, the job keeps the first phase, continues the warm phase from step 2 and writes the weights of
    the 3-step fit run in one go."""
    from gc25d_core.models.vae_fit import first_phase_files
    from gc25d_core.preprocess.tiny_vae import run_fit
    from gc25d_core.report import StdoutReporter

    def cfg_of(root: Path, then_steps: int | None):
        then = None if then_steps is None else dict(steps=then_steps, batch=1, frames=9, warm=1, lr=1e-3)
        return _fit_cfg(root, tiny_raw.root, steps=2, then=then)

    rep = StdoutReporter(rank=0)
    alone = run_fit(cfg_of(tmp_path / "alone", None), rep)
    two = run_fit(cfg_of(tmp_path / "a", 2), rep)
    first = two["first_phase"]
    assert (first["kept"], first["steps"], two["steps"]) == (False, 2, 4)
    assert first["sha256"] == alone["sha256"] != two["sha256"]
    weights, _, record = first_phase_files(cfg_of(tmp_path / "a", 2))
    assert weights.is_file() and json.loads(record.read_text())["path"] == weights.name

    raised = run_fit(cfg_of(tmp_path / "a", 3), rep)
    whole = run_fit(cfg_of(tmp_path / "b", 3), rep)
    assert raised["first_phase"]["kept"] and not whole["first_phase"]["kept"]
    assert (raised["resumed_from"], whole["resumed_from"]) == (2, 0)
    assert raised["sha256"] == whole["sha256"] != two["sha256"]
    assert run_fit(cfg_of(tmp_path / "a", 3), rep)["skipped"]


def test_a_killed_tiny_vae_job_continues_its_fit_to_the_same_weights(tmp_path, tiny_raw):
    """The tiny_vae job through torchrun, killed hard (os._exit) in its 3rd fit step with its state
    written after every step: run again, it continues from step 2 and writes the weights of the
    fit run in one go (same SHA256)."""
    fit = dict(enabled=True, steps=4, batch=1, crop=32, eval_frames=5, dim=8, dec_dim=8, state_every_s=1e-9)
    cfgs = {}
    for name in ("killed", "clean"):
        over = {"paths": {"data_root": str(tmp_path / name)}, "raw": {"root": str(tiny_raw.root)}}
        cfgs[name] = load_config("tiny", {**over, "vae": {"fit": fit}})
        build_and_write(tiny_raw.root, cfgs[name])

    def job(name: str, fault: str | None = None) -> subprocess.CompletedProcess:
        return _run_job(cfgs[name], tmp_path / name / "run", fault, "gc25d_core.jobs.tiny_vae", 1)

    assert job("killed", fault="rank=0,step=3,mode=exit").returncode != 0
    models = tmp_path / "killed" / "models"
    assert (models / "tiny_vae.state.safetensors").is_file() and not (
        models / "tiny_vae.safetensors"
    ).exists()
    resumed, clean = job("killed"), job("clean")
    assert resumed.returncode == 0 and clean.returncode == 0, (resumed.stderr + clean.stderr)[-3000:]
    resumed_md, clean_md = _summary(resumed), _summary(clean)
    assert (resumed_md["resumed_from"], clean_md["resumed_from"]) == (2, 0)
    assert resumed_md["sha256"] == clean_md["sha256"]


def test_a_class_weighted_tiny_vae_job_fits_under_its_own_key(tmp_path, tiny_raw, one_thread):
    """``vae.fit.class_weight``: the job reads the train clips' pixel ids and fits with them (other
    weights than the plain fit's), under a key of its own, and keeps its file on an unchanged rerun."""
    from gc25d_core.preprocess.tiny_vae import run_fit
    from gc25d_core.report import StdoutReporter

    rep = StdoutReporter(rank=0)
    plain = run_fit(_fit_cfg(tmp_path / "plain", tiny_raw.root, steps=2), rep)
    cfg = _fit_cfg(tmp_path / "cw", tiny_raw.root, steps=2, class_weight=0.5)
    weighted = run_fit(cfg, rep)
    assert weighted["inputs_key"] != plain["inputs_key"] and weighted["sha256"] != plain["sha256"]
    again = run_fit(cfg, rep)
    assert again["skipped"] and again["sha256"] == weighted["sha256"]
