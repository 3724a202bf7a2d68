"""Live sessions against the code world's truth (gc25d_core.eval.live): the scores on known inputs, a
seed's session the same twice, the action probe in the truth renderer, and results kept across runs
(a rerun computes nothing, a changed export recomputes its rows only)."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from gc25d_core.eval import live as L
from gc25d_core.eval import metrics as M
from gc25d_core.eval.live_run import shard
from gc25d_core.eval.run import run_eval
from gc25d_core.eval.spec import INPUT_FILE, EvalConfig, EvalInput, exports_of_handoff, write_model
from gc25d_core.eval.store import finished_eval
from gc25d_core.jobs.eval_live import DeployBackend
from gc25d_core.report import StdoutReporter
from gc25d_core.train.synthetic import random_teacher
from tests.eval.world import eval_world, with_random_vae

CELLS = 6  # a short session: 25 frames, seconds on a CPU


def test_identical_frames_score_the_maximum():
    f = np.random.default_rng(0).integers(0, 256, (3, 24, 32, 3), dtype=np.uint8)
    assert M.psnr_per_frame(f, f.copy()) == [M.PSNR_CAP_DB] * 3
    assert M.ssim_per_frame(f, f.copy()) == pytest.approx([1.0] * 3)


def test_an_offset_and_a_shifted_frame_drop_by_the_expected_amounts():
    flat = np.full((1, 16, 16, 3), 100, np.uint8)
    (p,) = M.psnr_per_frame(flat + 10, flat)  # MSE 100
    assert p == pytest.approx(10 * math.log10(255**2 / 100))
    # a uniform offset leaves contrast and structure: SSIM is the luminance term alone
    c1 = (0.01 * 255) ** 2
    assert M.ssim(flat[0] + 10, flat[0]) == pytest.approx((2 * 100 * 110 + c1) / (100**2 + 110**2 + c1))
    noise = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    shifted = np.roll(noise, 1, axis=1)
    d = noise.astype(float) - shifted
    assert M.psnr_per_frame(shifted[None], noise[None])[0] == pytest.approx(
        M.psnr_from_mse(float(np.mean(d * d)))
    )
    assert M.ssim(shifted, noise) < 0.1  # white noise moved by a pixel shares no structure
    assert M.slope_per([0, 1, 2], [30.0, 29.0, 28.0]) == pytest.approx(-1.0)
    assert math.isnan(M.slope_per([0, 1], [1.0, math.nan]))


def test_long_videos_score_in_chunks_and_threads_with_the_whole_videos_values():
    """PSNR and frame differences sum over chunks of 64 frames, SSIM runs on threads: each equals
    the float64 formula over the whole video, value for value (130 frames: three chunks)."""
    rng = np.random.default_rng(2)
    a, b = (rng.integers(0, 256, (130, 20, 24, 3), dtype=np.uint8) for _ in range(2))
    f = a.astype(np.int16)
    assert np.array_equal(M.frame_diffs(a), np.abs(f[1:] - f[:-1]).mean(axis=(1, 2, 3)) / 255.0)
    assert M.frame_diffs(a[:1]).shape == (0,)
    d = a.astype(np.float64) - b
    assert M.psnr_per_frame(a, b) == [M.psnr_from_mse(float(m)) for m in (d * d).mean(axis=(1, 2, 3))]
    assert M.ssim_per_frame(a, b, threads=4) == [M.ssim(x, y) for x, y in zip(a, b, strict=True)]


def test_the_ceiling_row_shows_where_the_truth_itself_is_harder_to_draw():
    """A session whose truth through the VAE falls from 30 to 20 dB at its second segment while the
    export holds 18 dB: the ceiling's segments, its drift (−10 dB in 1 s: −600 dB/min) and its
    table row and curves say so, apart from the export's flat drift."""
    from gc25d_core.eval.live_score import assemble_live
    from gc25d_core.eval.report import CEILING_LABEL, live_plots, live_table

    sweep = L.LiveSweep("live8", cells=8, segment_cells=4, change_cell=2, after_cells=2, revisit_gap=4)
    n = M.num_frames(9)
    frame = np.zeros((2, 4, 4, 3), np.uint8)
    ceiling = [30.0] * M.cell_frames(4).stop + [20.0] * (n - M.cell_frames(4).stop)
    own = {"psnr": [18.0] * n, "ssim": [0.5] * n, "diffs": [0.1] * (n - 1), "gt_diffs": [0.1] * (n - 1)}
    own |= {"digests": ["a"] * 8, "post_frames": frame, "psnr_ceiling": ceiling}
    changed = {"digests": ["a"] * 8, "post_frames": frame, "truth_change": 0.1}
    changed |= {"psnr_changed_truth": 17.0, "psnr_own_truth": 16.0}
    truth = L.Truth(frames=np.zeros((n, 4, 4, 3), np.uint8), eye=np.zeros((9, 3)), yaw=np.arange(9.0))
    row = assemble_live(sweep, {"own": own, "other": {"psnr": [15.0] * n}, "changed": changed}, truth)
    assert [s["psnr_ceiling"] for s in row["segments"]] == [30.0, 20.0]
    assert row["ceiling_drift_slope_db_per_min"] == pytest.approx(-600.0)
    assert row["drift_slope_db_per_min"] == pytest.approx(0.0)
    assert row["curves"]["psnr_ceiling"][1:] == [30.0] * 4 + [20.0] * 4
    result = {"export": {"label": "stage1_tf", "step": 5}, "sweeps": {"live8": row}}
    lines = live_table([result, result], "live8").splitlines()
    assert lines[-1].startswith(f"| {CEILING_LABEL} | – | 30 | 20 | -600 | –") and len(lines) == 5
    assert lines[-1].count("|") == lines[-2].count("|")
    assert sorted(live_plots([result], "live8")) == ["live8_psnr.png", "stage1_tf/live8_drift.png"]


def test_the_script_walks_fights_and_comes_back():
    a, b = L.session_script(0, 240), L.session_script(0, 240)
    assert len(a) == 240 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, L.session_script(1, 240), strict=True))
    blocks = np.stack(a)
    assert (
        (blocks[:, 1] == 1).any() and (blocks[:, 2] > 0).any() and (blocks[:, 3] == 1).any()
    )  # runs, fights
    assert {1, 2} <= set(blocks[:, 0].tolist())  # out and back
    changed = L.changed_script(a, 24)
    assert [i for i in range(240) if not np.array_equal(changed[i], a[i])] == [23]


def test_tasks_are_shared_longest_first():
    from gc25d_core.eval.live_run import TASK_KINDS

    sweep = L.LIVE_SWEEPS["live240"]
    tasks = [(e, "live240", k) for e in ("a", "b", "c") for k in TASK_KINDS]

    def cost(t):
        return sum(sweep.rollout_cells(k) for k in t[2])

    parts = shard(tasks, cost, 2)
    loads = [sum(cost(t) for t in p) for p in parts]
    assert sorted(t for p in parts for t in p) == sorted(tasks) and abs(loads[0] - loads[1]) <= 480
    assert sorted(k for kinds in TASK_KINDS for k in kinds) == sorted(L.KINDS)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    cfg = with_random_vae(eval_world(root))
    from gc25d_core.models.vae import build_vae_for

    vae = build_vae_for(cfg, torch.device("cpu"))
    return root, cfg, DeployBackend(cfg, vae, torch.device("cpu")), vae


def test_the_truth_changes_only_after_the_changed_action(world):
    _, _, backend, _ = world
    blocks = L.session_script(0, CELLS)
    k = 4
    base = L.render_truth(backend, blocks)
    again = L.render_truth(backend, blocks)
    assert np.array_equal(base.frames, again.frames)  # a seed's truth is the same every time
    changed = L.render_truth(backend, L.changed_script(blocks, k))
    first = M.cell_frames(k).start  # frames 0 … 4k−4 come before the changed action
    assert np.array_equal(changed.frames[:first], base.frames[:first])
    assert not np.array_equal(changed.frames[first:], base.frames[first:])


def test_a_seeds_session_plays_the_same_frames(world):
    root, cfg, backend, _ = world
    (export,) = exports_of_handoff("stage1_tf", random_teacher(cfg, root, causal=True), root)
    session = backend.session(export.path, export.sha256)
    blocks = L.session_script(0, 4)
    one, two = L.play(session, blocks), L.play(session, blocks)
    assert one.frames.shape == (M.num_frames(5), *cfg_frame(cfg), 3) and one.latents.shape[1] == 4
    assert np.array_equal(one.frames, two.frames) and np.array_equal(one.ids, two.ids)
    other = L.play(session, L.session_script(1, 4))
    assert not np.array_equal(other.ids, one.ids)
    # two rows of one length decoded as one batch: each row's frames within a uint8 step of its own
    both = L.play_rows(session, [blocks, L.session_script(1, 4)])
    for got, want in zip(both, (one, other), strict=True):
        assert np.array_equal(got.ids, want.ids) and torch.equal(got.latents, want.latents)
        assert np.abs(got.frames.astype(int) - want.frames).max() <= 1
    assert not torch.equal(both[0].latents, both[1].latents)  # two sessions, not one row twice


def world_ids(backend, cfg, blocks):
    """What a session's world draws for ``blocks`` from reset: (ids, prompt key) per cell."""
    from gc25d_core.deploy.world import LiveWorld

    w = LiveWorld(backend.world, cfg.geometry)
    w.reset(with_rgb=False)
    return [w.advance(b) for b in blocks]


def two_rank_job(monkeypatch, tmp_path):
    """Two ranks of one job in this process (the test sets ``global_rank``; no barrier: both "ranks"
    set up before either draws), their run folder's ``live/``: (the sweep's name, its plays)."""
    from gc25d_core.eval import live_run

    sweep = L.live_sweep("live240", cells=CELLS)
    (tmp_path / "live").mkdir()
    monkeypatch.setattr(live_run, "world_size", lambda: 2)
    monkeypatch.setattr(live_run, "barrier", lambda: None)
    return sweep.name, {sweep.name: live_run.scripts(sweep)}


def test_kept_cells_replay_the_worlds_ids_and_leave_a_path_where_it_forks(world):
    """The ids a rank keeps for the next export's session are the world's own, on the same path and
    after a fork (the action probe shares the scored session's first cells), and read-only."""
    from gc25d_core.deploy.world import LiveWorld
    from gc25d_core.jobs.eval_live import KeptCellsWorld

    _, cfg, backend, _ = world
    own = L.session_script(0, CELLS)
    forked = L.changed_script(own, 3)
    cells: dict = {}
    for blocks in (own, own, forked, own):
        kept = KeptCellsWorld(LiveWorld(backend.world, cfg.geometry), cells)
        kept.reset(with_rgb=False)
        got = [kept.advance(b) for b in blocks]
        for (ids, key), (want_ids, want_key) in zip(got, world_ids(backend, cfg, blocks), strict=True):
            assert np.array_equal(ids, want_ids) and key == want_key
    assert len(cells) == CELLS + (CELLS - 2)  # the fork's cells 3.. are its own
    with pytest.raises(ValueError):  # the kept arrays are read-only; a session gets its own copy
        next(iter(cells.values()))[0][0, 0, 0] = 1
    kept = KeptCellsWorld(LiveWorld(backend.world, cfg.geometry), cells)
    kept.reset(with_rgb=False)
    handed, _ = kept.advance(own[0])
    handed[...] = 0  # writable, and not the kept array: the kept one is still the world's
    assert np.array_equal(next(iter(cells.values()))[0], world_ids(backend, cfg, own[:1])[0][0])


def cfg_frame(cfg) -> tuple[int, int]:
    return cfg.geometry.dst_height, cfg.geometry.dst_width


def test_a_rerun_computes_nothing_and_a_changed_export_only_its_rows(world):
    root, cfg, backend, _ = world
    ecfg = EvalConfig(clip28_clips=0, chain241_chains=0, live_sweeps=["live240"], live_cells=CELLS)
    s1 = exports_of_handoff("stage1_tf", random_teacher(cfg, root, causal=True), root)
    s2 = exports_of_handoff(
        "stage2_cd", random_teacher(cfg, root, seed=1, causal=True, stage="stage2_cd"), root
    )
    # one file named twice (a label of the same SHA256) is evaluated once
    exports = [*s1, s2[0], replace(s1[0], label="stage1_again")]
    run_dir = root / "eval_run"
    shutil.rmtree(root / "eval_results", ignore_errors=True)
    run_dir.mkdir()
    write_model(run_dir, INPUT_FILE, EvalInput(manifest_version=1, eval=ecfg, exports=exports))
    factory = lambda vae, device: DeployBackend(cfg, vae, device)  # noqa: E731
    out = run_eval(cfg, run_dir, StdoutReporter(rank=0), factory)
    assert out is not None and out.computed == {"live240": 6} and out.kept == []
    table = (run_dir / "table.md").read_text()
    assert "| stage1_tf |" in table and "| stage1_again |" in table and "drift dB/min" in table
    assert (run_dir / "stage1_tf" / "live240_drift.png").read_bytes()[:4] == b"\x89PNG"
    # the asset's check before a launch: this run folder holds this evaluation
    assert finished_eval(cfg, run_dir) == out and out.job_key is not None
    again = run_eval(cfg, run_dir, StdoutReporter(rank=0), factory)
    assert again is not None and again.computed == {"live240": 0}
    assert (run_dir / "table.md").read_text() == table
    assert again.job_key == out.job_key
    # stage 2 trained on: a new file, its rows alone computed again
    s2b = exports_of_handoff(
        "stage2_cd", random_teacher(cfg, root, seed=2, causal=True, stage="stage2_cd"), root
    )
    write_model(run_dir, INPUT_FILE, EvalInput(manifest_version=1, eval=ecfg, exports=[*s1, s2b[0]]))
    assert finished_eval(cfg, run_dir) is None  # another input: the job has work to do
    third = run_eval(cfg, run_dir, StdoutReporter(rank=0), factory)
    assert third is not None and third.computed == {"live240": 3} and third.kept == ["stage1_tf/live240"]
    (run_dir / third.plots[0]).unlink()  # a report file gone: the job writes it again
    assert finished_eval(cfg, run_dir) is None


def test_the_truth_through_the_vae_is_scored_beside_the_exports(world, tmp_path, capsys):
    """``live_ceiling``: each segment also scores the truth's encode decoded as the sessions' frames
    are (what perfect latents would show), one reading for every export, and the table gets its row;
    the exports' own numbers do not move, and a row with it is not one without it.
    bench/quality/live_ceiling reads the same from the VAE's file alone."""
    import json

    from bench.quality import live_ceiling
    from gc25d_core.models.loading import WeightsError
    from gc25d_core.models.vae import decode_frames
    from gc25d_core.models.vae_fit import save_tiny_vae

    root, cfg, backend, vae = world
    (s1,) = exports_of_handoff("stage1_tf", random_teacher(cfg, root, seed=5, causal=True), root)
    s2 = exports_of_handoff(
        "stage2_cd", random_teacher(cfg, root, seed=6, causal=True, stage="stage2_cd"), root
    )[0]
    factory = lambda vae, device: DeployBackend(cfg, vae, device)  # noqa: E731

    def evaluate(ceiling: bool) -> tuple[object, dict[str, dict], str]:
        run_dir = tmp_path / f"ceiling_{ceiling}"
        run_dir.mkdir()
        ecfg = EvalConfig(
            clip28_clips=0, chain241_chains=0, live_sweeps=["live240"], live_cells=CELLS, live_ceiling=ceiling
        )
        write_model(run_dir, INPUT_FILE, EvalInput(manifest_version=1, eval=ecfg, exports=[s1, s2]))
        out = run_eval(cfg, run_dir, StdoutReporter(rank=0), factory)
        rows = {
            e.label: json.loads((run_dir / e.label / "metrics.json").read_text())["sweeps"]["live240"]
            for e in (s1, s2)
        }
        return out, rows, (run_dir / "table.md").read_text()

    _, plain, plain_table = evaluate(False)
    out, rows, table = evaluate(True)
    assert out is not None and out.computed == {"live240": 6}  # not the rows without it, kept
    # the reference, apart from the eval's code: the whole truth encoded, decoded in one go
    truth = L.render_truth(backend, L.session_script(0, CELLS))
    want = M.psnr_per_frame(decode_frames(vae, L.truth_latents(vae, np.array(truth.frames))), truth.frames)
    sweep = L.live_sweep("live240", CELLS)
    for label in ("stage1_tf", "stage2_cd"):
        got, before = rows[label]["segments"], plain[label]["segments"]
        for (lo, hi), seg, old in zip(sweep.segments(), got, before, strict=True):
            frames = slice(M.cell_frames(lo).start, M.cell_frames(hi).stop)
            assert seg["psnr_ceiling"] == pytest.approx(float(np.mean(want[frames])), abs=0.05)
            assert seg["psnr"] == old["psnr"] and "psnr_ceiling" not in old
        # one segment in a short session: no slope, as for the exports
        assert rows[label]["ceiling_drift_slope_db_per_min"] is rows[label]["drift_slope_db_per_min"] is None
        assert len(rows[label]["curves"]["psnr_ceiling"]) == CELLS + 1
    assert [s["psnr_ceiling"] for s in rows["stage1_tf"]["segments"]] == [
        s["psnr_ceiling"] for s in rows["stage2_cd"]["segments"]
    ]
    (line,) = [x for x in table.splitlines() if x.startswith("| the truth through the VAE |")]
    assert line.count("|") == table.splitlines()[-3].count("|")  # as many cells as an export's row
    assert "the truth through the VAE" not in plain_table
    assert [x for x in table.splitlines() if x.startswith("| stage")] == [
        x for x in plain_table.splitlines() if x.startswith("| stage")
    ]
    path = tmp_path / "tiny_vae.safetensors"
    digest = save_tiny_vae(vae, path)
    with pytest.raises(WeightsError, match="--sha256"):
        live_ceiling.main(["--vae", str(path), "--sha256", "0" * 64, "--cells", str(CELLS)])
    capsys.readouterr()
    live_ceiling.main(["--vae", str(path), "--sha256", digest, "--cells", str(CELLS)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [s["psnr"] for s in printed["segments"]] == pytest.approx(
        [s["psnr_ceiling"] for s in rows["stage1_tf"]["segments"]], abs=0.05
    )


def test_an_eval_stopped_part_way_keeps_the_rows_it_finished(world, tmp_path):
    """One rank: an export's live row is kept as soon as it is scored, so an eval stopped in the
    next export (here: its session fails to load) recomputes only what it had not finished."""
    root, cfg, _, _ = world
    ecfg = EvalConfig(clip28_clips=0, chain241_chains=0, live_sweeps=["live240"], live_cells=CELLS)
    s1 = exports_of_handoff("stage1_tf", random_teacher(cfg, root, seed=3, causal=True), root)
    s2 = exports_of_handoff(
        "stage2_cd", random_teacher(cfg, root, seed=4, causal=True, stage="stage2_cd"), root
    )
    run_dir = tmp_path / "eval_run"
    run_dir.mkdir()
    write_model(run_dir, INPUT_FILE, EvalInput(manifest_version=1, eval=ecfg, exports=[*s1, *s2]))

    class StopsAtStage2(DeployBackend):
        def session(self, export, sha256):
            if sha256 == s2[0].sha256:
                raise KeyboardInterrupt("the device call ended")
            return super().session(export, sha256)

    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, run_dir, StdoutReporter(rank=0), lambda vae, device: StopsAtStage2(cfg, vae, device))
    again = run_eval(
        cfg, run_dir, StdoutReporter(rank=0), lambda vae, device: DeployBackend(cfg, vae, device)
    )
    assert again is not None and again.kept == ["stage1_tf/live240"] and again.computed == {"live240": 3}


def test_a_long_sessions_truth_drawn_beside_the_sessions_gives_the_same_rows(world, tmp_path, monkeypatch):
    """A long session's truth is drawn in a (spawned) process pool on a thread while the rank plays:
    the rows equal those of the truth drawn first, in this process."""
    import json

    from gc25d_core.eval.live_run import run_live

    root, cfg, _, vae = world
    (export,) = exports_of_handoff("stage1_tf", random_teacher(cfg, root, seed=6, causal=True), root)
    sweep = L.live_sweep("live240", cells=CELLS)
    rows, logs = {}, {}
    for pool in (False, True):
        monkeypatch.setattr(L, "POOL_MIN_FRAMES", 1 if pool else 2000)
        monkeypatch.setattr("os.cpu_count", lambda: 2)  # two processes whatever the machine
        logs[pool] = []
        rows[pool] = run_live(
            cfg,
            DeployBackend(cfg, vae, torch.device("cpu")),
            vae,
            [(export, sweep)],
            tmp_path / str(pool),
            M.PSNR_CAP_DB,
            logs[pool].append,
        )
    assert any("beside the sessions (2 processes)" in line for line in logs[True]), logs[True]
    assert not any("beside the sessions" in line for line in logs[False])
    ((key, row),) = rows[True].items()
    assert (
        json.dumps(row["sweep"]) == json.dumps(rows[False][key]["sweep"])
        and row["strip"] == rows[False][key]["strip"]
    )


@pytest.mark.gpu
def test_cuda_eval_sessions_replay_graphs_with_the_eager_paths_results(world):
    """On CUDA the eval's sessions replay CUDA graphs: two scripts played from two starts, past a
    full window and the RoPE cap, give the eager sessions' latents, ids and frames bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gc25d_core.models.vae import build_vae_for

    root, cfg, _, _ = world
    device = torch.device("cuda")
    vae = build_vae_for(cfg, device)
    (export,) = exports_of_handoff("stage1_tf", random_teacher(cfg, root, seed=5, causal=True), root)
    scripts = [L.session_script(0, 30), L.session_script(1, 30)]
    played, runtimes = {}, {}
    for graphs in (False, True):
        session = DeployBackend(cfg, vae, device, cuda_graphs=graphs).session(export.path, export.sha256)
        played[graphs], runtimes[graphs] = L.play_rows(session, scripts), session.runtime
    assert runtimes[False].graphed is None
    assert runtimes[True].graphed is not None and runtimes[True].graphed.disabled is None
    assert runtimes[True].graphed.replays >= 2 * 5 * 30  # every forward of both sessions' cells
    for eager, graphed in zip(played[False], played[True], strict=True):
        assert torch.equal(eager.latents, graphed.latents)
        assert np.array_equal(eager.ids, graphed.ids) and np.array_equal(eager.frames, graphed.frames)


@pytest.mark.gpu
def test_cuda_sessions_read_the_truth_through_the_vae_as_the_cpus_do(world):
    """The ceiling a CUDA session decodes (its runtime's decoder, dtype and all) is the CPU session's
    within 0.2 dB a frame: the GPU presets' rows compare with a reading made on a CPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from gc25d_core.models.vae import build_vae_for

    root, cfg, backend, vae = world
    (export,) = exports_of_handoff("stage1_tf", random_teacher(cfg, root, seed=5, causal=True), root)
    truth = L.render_truth(backend, L.session_script(0, CELLS))
    z = L.truth_latents(vae, np.array(truth.frames))
    cuda = DeployBackend(cfg, build_vae_for(cfg, torch.device("cuda")), torch.device("cuda"))
    got = [
        L.ceiling_psnr(b.session(export.path, export.sha256), z, truth.frames, M.PSNR_CAP_DB)
        for b in (backend, cuda)
    ]
    assert len(got[0]) == len(truth.frames) and min(got[0]) > 0
    assert np.abs(np.subtract(*got)).max() < 0.2


def test_a_rank_gets_the_truth_once_every_rank_has_drawn_not_once_every_rank_asks(
    world, tmp_path, monkeypatch
):
    """Two ranks of one job: rank 0 asks for the truth first and has it as soon as rank 1 has drawn
    its frames, without rank 1 asking for it (no collective); a mark an earlier job left in the run
    folder is cleared before anyone draws."""
    import threading

    from gc25d_core.eval import live_run

    _, _, backend, _ = world
    name, plays = two_rank_job(monkeypatch, tmp_path)
    (tmp_path / "live" / "truth_drawn.rank1").touch()  # an earlier job's
    monkeypatch.setattr(live_run, "global_rank", lambda: 0)
    rank0 = live_run.Truths(backend, plays, set(), tmp_path, lambda m: None)  # draws frames 0, 2, 4, …
    assert not (tmp_path / "live" / "truth_drawn.rank1").exists()
    draw = live_run.Truths._draw
    monkeypatch.setattr(live_run, "global_rank", lambda: 1)
    monkeypatch.setattr(live_run.Truths, "_draw", lambda self: None)  # rank 1 draws later
    rank1 = live_run.Truths(backend, plays, set(), tmp_path, lambda m: None)
    got: dict[str, L.Truth] = {}
    waiting = threading.Thread(target=lambda: got.update(rank0.get()))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # rank 1's frames are not drawn: rank 0 has no truth yet
    draw(rank1)  # frames 1, 3, 5, …, then its mark
    waiting.join(10)
    frames = L.render_truth(backend, plays[name]["own"]).frames
    assert not waiting.is_alive() and np.array_equal(got[name].frames, frames)
    assert np.array_equal(rank1.get()[name].frames, frames)


def test_one_rank_encodes_the_truth_and_the_others_read_its_file(world, tmp_path, monkeypatch):
    """Two ranks that both score an own rollout, the truth drawn before the sessions: the less
    loaded rank encodes it before its sessions and writes it; the other reads that file when it
    first scores (waiting for it): the tensor of its own encode. An earlier job's file is cleared
    before anyone reads."""
    import threading

    from gc25d_core.eval import live_run

    _, _, backend, vae = world
    name, plays = two_rank_job(monkeypatch, tmp_path)
    stale = tmp_path / "live" / f"{name}_truth_latent.npy"
    np.save(stale, np.zeros(3, np.float32))  # an earlier job's
    plan = [[("a", name, ("own", "other")), ("b", name, ("changed",))], [("c", name, ("own", "other"))]]
    weights = {"own": 10, "other": 10, "changed": 3}

    def cost(t):
        return sum(weights[k] for k in t[2])

    monkeypatch.setattr(live_run, "global_rank", lambda: 0)
    rank0 = live_run.Truths(backend, plays, set(), tmp_path, lambda m: None)
    assert not stale.exists()
    rank0.share_encodes(vae, plan, cost)
    assert rank0.encoder == {name: 1} and not stale.exists()  # rank 1 has less to play: 20 < 23
    got = {}
    waiting = threading.Thread(target=lambda: got.update(z=rank0.latent(name, vae)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # no file yet: rank 0 waits for it, and does not encode itself
    monkeypatch.setattr(live_run, "global_rank", lambda: 1)
    rank1 = live_run.Truths(backend, plays, set(), tmp_path, lambda m: None)
    rank1.share_encodes(vae, plan, cost)  # draws its frames, encodes, writes
    waiting.join(60)
    assert not waiting.is_alive()
    want = L.truth_latents(vae, L.render_truth(backend, plays[name]["own"]).frames)
    assert torch.equal(got["z"], want) and torch.equal(rank1.latent(name, vae), want)


def test_each_whole_session_s_cells_are_drawn_by_one_rank_and_replayed_by_every_rank(
    world, tmp_path, monkeypatch
):
    """Two ranks of one job on a CPU: each draws the ids of one of the sessions every export plays
    whole (own, other) before its sessions and writes them; the other rank reads that file before
    it plays them (waiting for it), and its sessions replay the world's own ids without drawing."""
    import threading

    from gc25d_core.deploy.world import LiveWorld
    from gc25d_core.eval import live_run
    from gc25d_core.jobs.eval_live import KeptCellsWorld

    _, cfg, _, vae = world
    backends = [DeployBackend(cfg, vae, torch.device("cpu")) for _ in range(2)]
    name, plays = two_rank_job(monkeypatch, tmp_path)
    stale = tmp_path / "live" / f"{name}_own_ids.npy"
    np.save(stale, np.zeros(3, np.uint8))  # an earlier job's
    monkeypatch.setattr(live_run, "global_rank", lambda: 0)
    rank0 = live_run.Truths(backends[0], plays, set(), tmp_path, lambda m: None)
    assert sorted(rank0.cell_paths) == [(name, "other"), (name, "own")]
    assert rank0.cell_paths[name, "other"].is_file() and not stale.exists()  # rank 0 drew one, not both
    waiting = threading.Thread(target=lambda: rank0.keep_cells(name, ("own", "other")))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # the own session's cells are rank 1's to draw
    monkeypatch.setattr(live_run, "global_rank", lambda: 1)
    rank1 = live_run.Truths(backends[1], plays, {name}, tmp_path, lambda m: None)
    rank1.keep_cells(name, ("changed",))  # its first cells are the own session's: read from rank 0
    waiting.join(10)
    assert not waiting.is_alive() and stale.is_file()
    assert len(backends[1]._cells) == CELLS  # the other session's: read when it is to be played
    rank1.keep_cells(name, ("own", "other"))

    def no_drawing(block):
        raise AssertionError("a kept cell was drawn again")

    for b in backends:
        assert len(b._cells) == 2 * CELLS
        for kind in ("own", "other"):
            kept = KeptCellsWorld(LiveWorld(b.world, cfg.geometry), b._cells)
            kept.reset(with_rgb=False)
            kept.world.advance = no_drawing  # type: ignore[method-assign]
            got = [kept.advance(blk) for blk in plays[name][kind]]
            want = world_ids(backends[0], cfg, plays[name][kind])
            for (ids, key), (want_ids, want_key) in zip(got, want, strict=True):
                assert np.array_equal(ids, want_ids) and key == want_key
