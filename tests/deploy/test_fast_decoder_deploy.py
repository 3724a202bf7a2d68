"""Deploy with ``decoder='fast'``: the session decodes with the fast_decoder asset's file (its SHA256
checked against its record) and yields the live frames' shapes and dtype; without the asset it refuses
naming the record file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gc25d_core.deploy.runtime import RuntimeOptions
from gc25d_core.deploy.session import open_session
from gc25d_core.models.fast_decoder import (
    FastDecoder,
    StreamingFastDecoder,
    record_file,
    save_fast_decoder,
    weights_file,
)
from gc25d_core.models.loading import WeightsError
from tests.deploy.conftest import tiny_deploy_cfg


def test_a_session_with_the_fast_decoder_yields_uint8_frames_of_the_geometry(tiny_export, tmp_path):
    cfg = tiny_deploy_cfg(tmp_path)
    with pytest.raises(WeightsError, match=f"{record_file(cfg)} does not exist"):
        open_session(tiny_export, cfg, device="cpu", options=RuntimeOptions(decoder="fast"))
    torch.manual_seed(0)
    digest = save_fast_decoder(FastDecoder(width=8), weights_file(cfg))
    record_file(cfg).write_text(json.dumps({"sha256": digest, "inputs_key": "test"}))

    s = open_session(tiny_export, cfg, device="cpu", options=RuntimeOptions(decoder="fast"))
    assert isinstance(s.runtime.decoder, StreamingFastDecoder)
    h, w = cfg.geometry.dst_height, cfg.geometry.dst_width
    first = s.start()
    assert [f.shape for f in first] == [(1, h, w, 3)] and first[0].dtype == np.uint8
    for block in (np.array([1, 0, 0, 0, 0], np.uint8), np.array([0, 1, 0, 0, 0], np.uint8)):
        frames = s.step(block).out.frames
        assert [f.shape for f in frames] == [(4, h, w, 3)] and frames[0].dtype == np.uint8
    assert s.runtime.decoder.cells == 3

    record_file(cfg).write_text(json.dumps({"sha256": "0" * 64, "inputs_key": "test"}))
    with pytest.raises(WeightsError, match="does not match 'sha256' in"):
        open_session(tiny_export, cfg, device="cpu", options=RuntimeOptions(decoder="fast"))


def test_the_runtime_refuses_decoder_fast_without_a_decoder(tiny_export, deploy_cfg):
    from gc25d_core.deploy.runtime import DeployRuntime
    from gc25d_core.models.vae import build_vae_for
    from gc25d_core.text import load_text_table

    vae = build_vae_for(deploy_cfg, torch.device("cpu"))
    with pytest.raises(ValueError, match="decoder='fast' needs the fast decoder"):
        DeployRuntime.load(
            tiny_export, load_text_table(deploy_cfg), vae, options=RuntimeOptions(decoder="fast")
        )


def test_the_decoder_switch_continues_the_session_as_that_decoder_would(tiny_export, tmp_path):
    """``set_decoder`` between cells (the page's switch): the new stream replays the latents the
    session decoded, so in a session shorter than ``REPLAY_CELLS`` the frames after a switch are
    those of a session that used that decoder from its start, both ways. A session opens with the
    fast decoder beside the VAE wherever the asset's file is there; without it, the VAE alone."""
    from gc25d_core.deploy.runtime import REPLAY_CELLS

    cfg = tiny_deploy_cfg(tmp_path)
    alone = open_session(tiny_export, cfg, device="cpu")
    assert sorted(alone.runtime.decoders) == ["vae"]
    with pytest.raises(ValueError, match="no 'fast' decoder in this session"):
        alone.runtime.set_decoder("fast")
    torch.manual_seed(0)
    digest = save_fast_decoder(FastDecoder(width=8), weights_file(cfg))
    record_file(cfg).write_text(json.dumps({"sha256": digest, "inputs_key": "test"}))
    blocks = [np.array([b, 0, 0, 0, 0], np.uint8) for b in (1, 1, 3, 0, 2)]
    assert len(blocks) + 1 <= REPLAY_CELLS

    def play(s, switch_at=None, to=None):
        frames = list(s.start())
        for i, block in enumerate(blocks):
            if i == switch_at:
                s.runtime.set_decoder(to)
            frames += s.step(block).out.frames
        return frames

    s = open_session(tiny_export, cfg, device="cpu")
    assert sorted(s.runtime.decoders) == ["fast", "vae"] and s.runtime.options.decoder == "vae"
    vae = play(s)
    fast = play(open_session(tiny_export, cfg, device="cpu", options=RuntimeOptions(decoder="fast")))
    assert not np.array_equal(vae[3], fast[3])  # two decoders, two pictures
    to_fast = play(s, switch_at=2, to="fast")  # frames of the anchor and cells 1-2 by the VAE
    assert s.runtime.options.decoder == "fast"
    for got, want in zip(to_fast, vae[:3] + fast[3:], strict=True):
        assert np.array_equal(got, want)
    back = play(s, switch_at=3, to="vae")  # the session starts on the fast decoder now
    for got, want in zip(back, fast[:4] + vae[4:], strict=True):
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    ("wanted", "device", "record", "expected"),
    [
        ("auto", "cuda", {"gap_db": 0.42}, "fast"),  # the small preset's fit (2026-12-03)
        ("auto", "cuda", {"gap_db": 1.5}, "fast"),  # the rule's bound itself
        ("auto", "cuda", {"gap_db": 1.51}, "vae"),
        ("auto", "cuda", {}, "vae"),  # a record without the held-out comparison
        ("auto", "cuda", None, "vae"),  # no fast_decoder asset
        ("auto", "cpu", {"gap_db": 0.42}, "vae"),  # the defaults follow the GPU's table
        ("fast", "cpu", None, "fast"),
        ("vae", "cuda", {"gap_db": 0.0}, "vae"),
    ],
)
def test_the_default_decoder_is_the_fast_one_on_cuda_where_its_fit_earned_it(
    wanted, device, record, expected
):
    from gc25d_core.deploy.session import resolve_decoder

    assert resolve_decoder(wanted, torch.device(device), record) == expected


def test_auto_opens_a_cpu_session_on_the_vae_with_the_fast_decoder_to_switch_to(tiny_export, tmp_path):
    from gc25d_core.deploy.cli import build_parser, runtime_options
    from gc25d_core.deploy.runtime import DeployRuntime
    from gc25d_core.models.vae import build_vae_for
    from gc25d_core.text import load_text_table

    cfg = tiny_deploy_cfg(tmp_path)
    torch.manual_seed(0)
    digest = save_fast_decoder(FastDecoder(width=8), weights_file(cfg))
    record_file(cfg).write_text(json.dumps({"sha256": digest, "inputs_key": "test", "gap_db": 0.4}))
    opts = runtime_options(build_parser().parse_args(["play"]), cuda=False)
    assert opts.decoder == "auto"  # the CLI's default
    s = open_session(tiny_export, cfg, device="cpu", options=opts)
    assert s.runtime.options.decoder == "vae" and sorted(s.runtime.decoders) == ["fast", "vae"]
    with pytest.raises(ValueError, match="resolved by deploy.session.open_session"):
        DeployRuntime.load(
            tiny_export, load_text_table(cfg), build_vae_for(cfg, torch.device("cpu")), options=opts
        )
