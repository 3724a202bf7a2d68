"""The live session on the tiny models: deterministic for a seed, actions move the world and the
picture, a 200-cell session never leaves the trained RoPE range or the window, bad inputs fail
naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.deploy.runtime import RuntimeOptions, load_deploy_model
from gc25d_core.deploy.session import open_session
from gc25d_core.models.causal import query_time_position, rope_time_positions
from gc25d_core.models.export import ExportError
from gc25d_core.models.kv_cache import KVCache

WALK = np.array([1, 0, 0, 0, 0], np.uint8)
RIGHT = np.array([4, 1, 0, 0, 0], np.uint8)


def _play(export, cfg, blocks, seed=0, **opts):
    s = open_session(export, cfg, options=RuntimeOptions(seed=seed, **opts))
    frames = s.start()
    outs = [s.step(b) for b in blocks]
    frames += [f for o in outs for f in o.out.frames]
    return np.concatenate(frames), outs


def test_session_is_deterministic_for_a_seed(tiny_export, deploy_cfg):
    blocks = [WALK, WALK, RIGHT]
    a, outs = _play(tiny_export, deploy_cfg, blocks, seed=3)
    b, _ = _play(tiny_export, deploy_cfg, blocks, seed=3)
    c, _ = _play(tiny_export, deploy_cfg, blocks, seed=4)
    g = deploy_cfg.geometry
    assert a.shape == (1 + 4 * len(blocks), g.dst_height, g.dst_width, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert [o.key for o in outs] == ["walk_forward", "walk_forward", "run_right"]
    assert all(o.ids.shape == (4, g.dst_height, g.dst_width) for o in outs)


def test_actions_change_the_world_and_the_picture(tiny_export, deploy_cfg):
    walk, wo = _play(tiny_export, deploy_cfg, [WALK] * 3)
    turn, to = _play(tiny_export, deploy_cfg, [RIGHT] * 3)
    assert np.array_equal(walk[:1], turn[:1])  # the same anchor
    assert not np.array_equal(wo[-1].ids, to[-1].ids)  # the world moved differently
    assert np.abs(walk[-4:].astype(int) - turn[-4:].astype(int)).mean() > 0.5


def test_200_cell_session_stays_in_the_rope_cap_and_the_window(tiny_export, deploy_cfg, monkeypatch):
    seen: dict[str, int] = {"max_pos": 0, "max_cached": 0, "cells": 0}
    begin = KVCache.begin

    def spy(self, cell):
        begin(self, cell)
        spec = self.spec
        pos = [query_time_position(cell, spec)]
        if self.cells:
            pos += rope_time_positions(torch.tensor(self.cells), cell, spec).tolist()
        seen["max_pos"] = max(seen["max_pos"], *pos)
        assert min(pos) >= 0
        seen["max_cached"] = max(seen["max_cached"], len(self.cells))
        seen["cells"] = max(seen["cells"], cell)

    monkeypatch.setattr(KVCache, "begin", spy)
    s = open_session(tiny_export, deploy_cfg, options=RuntimeOptions(decode=False))
    s.start()
    rng = np.random.default_rng(0)
    moves = [WALK, RIGHT, np.array([3, 0, 0, 0, 0]), np.array([0, 0, 1, 0, 0]), np.array([2, 0, 0, 1, 0])]
    for _ in range(200):
        out = s.step(moves[int(rng.integers(len(moves)))])
    spec = s.runtime.spec
    assert seen["cells"] == 200 and out.cell == 200
    assert seen["max_pos"] == spec.rope_cap  # reached, never passed
    assert seen["max_cached"] == spec.sink + spec.window - 1  # a full window, never more
    assert (
        s.runtime.streamer.cache is not None and len(s.runtime.streamer.cache) == spec.sink + spec.window - 1
    )
    assert torch.isfinite(out.out.latent).all()


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ([9, 0, 0, 0, 0], "move"),
        ([0, 2, 0, 0, 0], "run"),
        ([0, 0, 3, 0, 0], "attack"),
        ([0, 0, 0, 0, 7], "stance"),
    ],
)
def test_an_action_out_of_range_names_the_field(tiny_export, deploy_cfg, block, field):
    s = open_session(tiny_export, deploy_cfg, options=RuntimeOptions(decode=False))
    s.start()
    with pytest.raises(ValueError, match=f"field {field}="):
        s.step(block)
    with pytest.raises(ValueError, match="shape"):
        s.step([1, 0, 0])


def test_bad_exports_fail_naming_the_file_and_field(tmp_path, tiny_export):
    from tests.deploy.conftest import write_tiny_export

    with pytest.raises(ExportError, match="causal=false"):
        load_deploy_model(write_tiny_export(tmp_path / "bidir.safetensors", causal=False))
    ids_export = write_tiny_export(tmp_path / "ids.safetensors", vocab="ids")
    with pytest.raises(ExportError, match=r"ids.safetensors: vocab='ids'"):
        load_deploy_model(ids_export, vocab="parts")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(Exception, match="junk.safetensors|header|deserializ"):
        load_deploy_model(junk)
    with pytest.raises(Exception, match="sha256"):
        load_deploy_model(tiny_export, expected_sha256="0" * 64)
    with pytest.raises(ExportError, match="does not exist"):
        load_deploy_model(tmp_path / "missing.safetensors")
