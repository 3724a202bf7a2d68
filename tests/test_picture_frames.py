"""bench.quality.picture_sheet's frames file: what the GPU machine keeps of a played session and
the probe reads elsewhere (issue 35's picture on the `small` preset)."""

from pathlib import Path

import numpy as np
import pytest

from bench.quality.picture_sheet import read_frames, write_frames


def _frames(n: int = 3, h: int = 8, w: int = 16):
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    picture = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    ids = rng.integers(0, 30, (n, h, w), dtype=np.uint8)
    return truth, picture, ids


def test_frames_round_trip(tmp_path):
    path = tmp_path / "s.npz"
    arrays = _frames()
    write_frames(path, *arrays)
    for a, b in zip(read_frames(path), arrays, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_a_frames_file_without_an_array_or_with_other_shapes_is_refused(tmp_path):
    truth, picture, ids = _frames()
    path = tmp_path / "missing.npz"
    np.savez_compressed(path, truth=truth, picture=picture)
    with pytest.raises(ValueError, match=r"missing.npz: no \['ids'\] arrays"):
        read_frames(path)
    path = tmp_path / "float.npz"
    np.savez_compressed(path, truth=truth, picture=picture.astype(np.float32), ids=ids)
    with pytest.raises(ValueError, match="float.npz: picture is float32"):
        read_frames(path)
    path = tmp_path / "short.npz"
    np.savez_compressed(path, truth=truth[:2], picture=picture, ids=ids)
    with pytest.raises(ValueError, match="short.npz: truth is uint8 \\(2,"):
        read_frames(path)


def test_a_pickled_frames_file_is_not_loaded(tmp_path):
    path = tmp_path / "obj.npz"
    truth, picture, ids = _frames()
    np.savez(path, truth=np.array([object()], dtype=object), picture=picture, ids=ids)
    with pytest.raises(ValueError, match="allow_pickle"):
        read_frames(path)


def test_frames_of_another_shape_are_not_written(tmp_path):
    truth, picture, ids = _frames()
    chunks = np.repeat(picture[:, None], 4, axis=1)  # [N, 4, H, W, 3]: a cell's chunk, not its frame
    with pytest.raises(ValueError, match="picture is uint8 \\(3, 4,"):
        write_frames(tmp_path / "s.npz", truth, chunks, ids)
    assert not (tmp_path / "s.npz").exists()


def test_picture_study_fit_specs_name_steps_and_both_widths():
    import pytest

    from bench.quality.picture_study import parse_fit

    assert parse_fit("160@16") == (160, 16, 16)
    assert parse_fit("600@32/64") == (600, 32, 64)
    with pytest.raises(SystemExit, match=r"--fits: '600@wide' is not STEPS@DIM"):
        parse_fit("600@wide")


def test_picture_study_fits_take_the_batch_and_rate_given_else_the_presets(monkeypatch):
    from bench.quality import picture_study
    from gc25d_core.config import load_config

    seen = []

    def fit(clips, **kw):  # what the fit was asked for; no fit
        seen.append(kw)
        return None, {"steps": kw["steps"], "resumed_from": 0, "loss_last": None}

    monkeypatch.setattr("gc25d_core.models.vae_fit.fit_tiny_vae", fit)
    cfg = load_config("small")
    _, timing = picture_study.fit_vae([], 5, 16, cfg, batch=16, lr=2e-3, seconds=30.0)
    picture_study.fit_vae([], 5, 16, cfg)
    picture_study.fit_vae([], 5, 16, cfg, state=Path("fit.state.safetensors"))
    assert (seen[0]["batch"], seen[0]["lr"], seen[0]["seconds"]) == (16, 2e-3, 30.0)
    assert seen[0]["state"] is None and seen[2]["state"] == Path("fit.state.safetensors")
    assert seen[2]["state_must_match"]  # a state the user names is continued, never replaced
    assert (seen[1]["batch"], seen[1]["lr"], seen[1]["seconds"]) == (cfg.vae.fit.batch, cfg.vae.fit.lr, None)
    assert (cfg.vae.fit.batch, cfg.vae.fit.lr) == (64, 1e-3)
    # normalised as the tiny_vae job does (whole clips): a VAE saved here feeds the chain's latents
    assert (
        all(kw["norm_frames"] == cfg.vae.fit.norm_frames for kw in seen) and cfg.vae.fit.norm_frames is None
    )
    assert timing["steps"] == 5 and timing["step_s"] is None  # no step ran: no step time


def test_the_linear_code_cuts_squares_as_the_vae_does_and_keeps_what_its_rank_spans():
    from bench.quality.picture_study import linear_code_recon, patch_groups

    rng = np.random.default_rng(1)
    clips = [rng.integers(0, 256, (9, 32, 48, 3), dtype=np.uint8) for _ in range(4)]
    first, rest = patch_groups(clips[0])
    assert first.shape == (2 * 3, 16 * 16 * 3) and rest.shape == (2 * 2 * 3, 4 * 16 * 16 * 3)
    # square (0, 1) of frames 1..4, in time-major order: frame 1's pixels come first
    assert np.allclose(rest[1, : 16 * 16 * 3], clips[0][1, :16, 16:32].reshape(-1) / 255.0)
    # the full rank reproduces the frames; fewer numbers a latent lose detail, more lose less
    assert np.array_equal(linear_code_recon(clips * 300, clips[:1], 3072)[0], clips[0])
    err = [np.abs(linear_code_recon(clips, clips[:1], k)[0].astype(int) - clips[0]).mean() for k in (2, 16)]
    assert err[0] > err[1] > 0
    with pytest.raises(ValueError, match=r"1 \+ 4·n frames"):
        patch_groups(clips[0][:8])


def test_the_vae_over_time_splits_a_clip_into_latent_frames_and_scores_each():
    import torch

    from bench.quality.vae_over_time import main, over_time, psnr_of
    from gc25d_core.models.vae import build_vae, decode_frames, encode_frames

    torch.manual_seed(0)
    vae = build_vae(tiny=True, dim=8, dec_dim=8)
    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (9, 32, 64, 3), dtype=np.uint8) for _ in range(2)]
    rec, kept = over_time(vae, clips, keep=1)
    assert len(rec["var"]) == len(rec["psnr_db"]) == 3  # frame 0 alone, then 4 frames a latent
    assert rec["psnr_steady_db"] is None  # 3 latent frames: all start-up
    assert rec["psnr_first17_db"] == rec["psnr_whole_db"]  # 9 frames: the first 17 are all of them
    err = [
        ((decode_frames(vae, encode_frames(vae, c)).astype(float) - c) ** 2).mean(axis=(1, 2, 3))
        for c in clips
    ]
    e = np.mean(err, axis=0)
    np.testing.assert_array_equal(kept, decode_frames(vae, encode_frames(vae, clips[1])))  # the sheet's clip
    assert over_time(vae, clips)[1] is None
    assert rec["psnr_db"][0] == round(psnr_of(e[0]), 2) and rec["psnr_db"][2] == round(
        psnr_of(e[5:9].mean()), 2
    )
    assert psnr_of(0.0) == float("inf")
    with pytest.raises(SystemExit, match=r"--vae 'v.safetensors': FILE@SHA256"):
        main(["--raw", "raw", "--vae", "v.safetensors"])


def test_probe_capacity_reads_the_truth_and_not_a_blank_picture():
    from bench.quality.probe_capacity import capacity_row, main, with_blurred_copy

    rng = np.random.default_rng(0)
    colours = {0: (90, 160, 230), 2: (200, 180, 140), 10: (40, 60, 160)}  # sky, paving, the player

    def world(n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.zeros((n, 16, 32), np.uint8)
        ids[:, 8:] = 2
        for i in range(n):
            x = rng.integers(2, 26)
            ids[i, 5:13, x : x + 4] = 10
        rgb = np.stack([np.array(colours[int(c)], np.uint8) for c in ids.ravel()]).reshape(n, 16, 32, 3)
        return rgb, ids

    train, (truth, ids) = world(12), world(4)
    blank = np.full_like(truth, 128)
    settings = {"hidden": 16, "steps": 150, "per_class": 500, "batch": 256}
    row = capacity_row(
        "small", settings, train, {"ceiling": (truth, truth, ids), "blank": (truth, blank, ids)}
    )
    assert row["variant"] == "small" and row["settings"] == settings and row["fit_s"] >= 0
    assert row["ceiling"]["truth"] == row["ceiling"]["picture"] == row["blank"]["truth"]
    assert row["ceiling"]["truth"][0] > 0.9 and row["ceiling"]["truth"][1] > 0.8 and row["train_miou"] > 0.9
    assert row["blank"]["picture"][0] < 0.5 and row["blank"]["picture"][1] < 0.1
    assert (
        row["ceiling"]["blank"] == row["blank"]["blank"] == row["blank"]["picture"]
    )  # each set's grey frame
    assert set(row["truth_per_class"]) == {"sky", "paving"}  # the static classes the truth's ids hold
    # a reader fitted with blurred copies too: the pairs doubled, the ids the same, the frames blurred
    rgb2, ids2 = with_blurred_copy(train, 2.0)
    assert len(rgb2) == 24 and (ids2[12:] == train[1]).all() and (rgb2[:12] == train[0]).all()
    sigmas = np.random.default_rng(0).uniform(0.0, 2.0, 12)
    assert [bool((rgb2[12 + i] != train[0][i]).any()) for i in range(12)] == list(sigmas >= 0.3)
    blurred = capacity_row("blur", {**settings, "blur": 2.0}, train, {"ceiling": (truth, truth, ids)})
    assert blurred["settings"]["blur"] == 2.0 and blurred["ceiling"]["truth"][0] > 0.9
    with pytest.raises(SystemExit):
        main(["--raw", "raw", "--frames", "a=f.npz", "--variant", "bad={'hidden': 1}"])
