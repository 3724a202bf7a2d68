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
