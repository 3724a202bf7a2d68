"""bench/quality/small_chain.py's choice of lever checks (the GPU chain's `--levers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.quality.small_chain import _stage_section, lever_checks, stage_sets, stage_variants
from gc25d_core.config import load_config


def test_the_lever_checks_are_the_named_ones_in_order_and_unknown_names_are_refused():
    assert lever_checks(None, smoke=False) == ["--decoder fast", "--fp8"]
    assert lever_checks(None, smoke=True) == ["--decoder fast"]  # no FP8 on a CPU
    assert lever_checks("fp8", smoke=False) == ["--fp8"]
    assert lever_checks("", smoke=False) == []
    with pytest.raises(SystemExit, match=r"\['int4'\] are not among"):
        lever_checks("fp8,int4", smoke=False)


def test_set_puts_fields_into_a_stage_section_and_refuses_unknown_stages_and_fields():
    sets = stage_sets(["stage3_dmd.real_guidance=2", "stage3_dmd.val.every=25", "stage1_tf.max_steps=7"])
    assert sets == {"stage3_dmd": {"real_guidance": 2, "val": {"every": 25}}, "stage1_tf": {"max_steps": 7}}
    sec = _stage_section("stage3_dmd", False, {"stage3_dmd": 40}, sets)
    assert sec == {"max_steps": 40, "real_guidance": 2, "val": {"every": 25}}
    assert _stage_section("stage2_cd", False, {}, sets) == {}
    with pytest.raises(SystemExit, match=r"'sft.max_steps=3': expected STAGE.FIELD=VALUE"):
        stage_sets(["sft.max_steps=3"])  # the SFT has --sft-steps
    with pytest.raises(SystemExit, match=r"'stage3_dmd.real_guidance'"):
        stage_sets(["stage3_dmd.real_guidance"])
    with pytest.raises(SystemExit, match=r"real_guidanse"):
        stage_sets(["stage3_dmd.real_guidanse=2"])
    with pytest.raises(SystemExit, match=r"real_guidance"):
        stage_sets(["stage3_dmd.real_guidance=0.5"])  # below 1


def test_a_variant_is_a_named_set_of_the_last_stage_s_fields_checked_as_set_is():
    variants = stage_variants(["g2:real_guidance=2", "g15:real_guidance=1.5,val.every=10"], "stage3_dmd")
    assert variants == {
        "g2": {"stage3_dmd": {"real_guidance": 2}},
        "g15": {"stage3_dmd": {"real_guidance": 1.5, "val": {"every": 10}}},
    }
    for bad in ("real_guidance=2", "g2:", "g/2:real_guidance=2", "gé:real_guidance=2", "g.2:real_guidance=2"):
        with pytest.raises(SystemExit, match="expected NAME:FIELD=VALUE"):
            stage_variants([bad], "stage3_dmd")
    with pytest.raises(SystemExit, match="a new plain NAME"):
        stage_variants(["g2:real_guidance=2", "g2:real_guidance=3"], "stage3_dmd")
    with pytest.raises(SystemExit, match="real_guidance"):
        stage_variants(["g2:real_guidance=2"], "stage2_cd")  # not a field of stage 2's section


def test_without_this_runs_fit_the_default_checks_leave_the_fast_decoder_out():
    assert lever_checks(None, smoke=False, fitted=False) == ["--fp8"]
    assert lever_checks(None, smoke=True, fitted=False) == []
    assert lever_checks("fast", smoke=False, fitted=False) == ["--decoder fast"]  # asked: it runs


def test_a_given_vae_is_checked_copied_under_the_data_root_and_named_by_the_config(tmp_path):
    from bench.quality.small_preset import GIVEN_VAE, place_given_vae, small_config
    from gc25d_core.hashing import sha256_file

    src = tmp_path / "fit.safetensors"
    src.write_bytes(b"weights")
    sha = sha256_file(src)
    cfg, _ = small_config(tmp_path / "root", vae_sha256=sha)
    dst = tmp_path / "root" / "gc25d" / "models" / GIVEN_VAE
    assert cfg.vae.path is not None and Path(cfg.vae.path) == dst and cfg.vae.sha256 == sha
    with pytest.raises(
        SystemExit,
        match=r"--vae: VAE weights .*fit.safetensors: sha256 [0-9a-f]{64} does not match --vae-sha256 = 0{64}",
    ):
        place_given_vae(src, "0" * 64, dst)
    assert not dst.exists()
    with pytest.raises(SystemExit, match=r"--vae: VAE weights .*missing.safetensors do not exist"):
        place_given_vae(tmp_path / "missing.safetensors", sha, dst)
    place_given_vae(src, sha, dst)
    assert dst.read_bytes() == b"weights" and dst.stat().st_mode & 0o044 == 0o044  # the group reads it
    src.unlink()  # a copy with the digest stays: a rerun needs no source
    place_given_vae(src, sha, dst)
    assert small_config(tmp_path / "root")[0].vae.path is None  # without --vae: the fit


def test_vae_and_its_digest_go_together(capsys):
    from bench.quality import small_preset

    with pytest.raises(SystemExit):
        small_preset.main(["--root", "/nonexistent", "--vae", "x.safetensors"])
    assert "--vae and --vae-sha256 go together" in capsys.readouterr().err


def test_the_vae_width_reaches_the_fit_and_is_refused_beside_a_given_vae(tmp_path, capsys):
    from bench.quality import small_preset

    assert small_preset.parse_width("32/64") == (32, 64) and small_preset.parse_width("24") == (24, 24)
    with pytest.raises(SystemExit, match="DIM or DIM/DEC_DIM"):
        small_preset.parse_width("wide")
    cfg, _ = small_preset.small_config(tmp_path, vae_width=(32, 64))
    preset = load_config("small").vae.fit
    assert (cfg.vae.fit.dim, cfg.vae.fit.dec_dim) == (32, 64)
    assert cfg.vae.fit.model_dump(exclude={"dim", "dec_dim"}) == preset.model_dump(exclude={"dim", "dec_dim"})
    cfg, _ = small_preset.small_config(tmp_path, smoke=True, vae_width=(8, 24))
    assert (cfg.vae.fit.dim, cfg.vae.fit.dec_dim, cfg.vae.fit.steps) == (8, 24, 2)
    with pytest.raises(SystemExit):
        small_preset.main(
            ["--root", "/nonexistent", "--vae", "x", "--vae-sha256", "0" * 64, "--vae-width", "32"]
        )
    assert "a given --vae keeps the widths" in capsys.readouterr().err


def test_a_given_vae_whose_latents_are_off_unit_scale_stops_the_chain_naming_it_and_the_way_out():
    from bench.quality.small_preset import GIVEN_VAE_RMS, check_given_vae_scale

    lo, hi = GIVEN_VAE_RMS
    for rms in (1.0, lo, hi):
        check_given_vae_scale(Path("fit.safetensors"), rms)
    for rms in (1.99, 0.5):  # a normalisation measured on each clip's first 9 frames gave 1.99
        with pytest.raises(
            SystemExit, match=rf"--vae fit.safetensors: .* RMS {rms:.3f}, outside .*vae_renorm"
        ):
            check_given_vae_scale(Path("fit.safetensors"), rms)


def test_vae_renorm_reports_the_latents_rms_under_a_normalisation_and_refuses_to_overwrite_its_input():
    import torch

    from bench.quality.vae_renorm import main, rms_under

    zero, one = torch.zeros(48), torch.ones(48)
    assert rms_under(zero, one, zero, one) == pytest.approx(1.0)
    assert rms_under(zero, one, zero, 2 * one) == pytest.approx(2.0)  # std twice the assumed
    assert rms_under(zero, 2 * one, 2 * one, 2 * one) == pytest.approx(2**0.5)  # mean off by one std
    with pytest.raises(SystemExit, match="the same file as --vae"):
        main(["--raw", "raw", "--vae", "v.safetensors", "--sha256", "0" * 64, "--out", "v.safetensors"])
