"""Deploy's deferred commit: the commit forward of cell k runs after the cell's decode (not waited
for) instead of before it — the same forwards on the same inputs in the same order on the cache,
so the same latents, cache and frames as committing at once (bit for bit on a CPU; the gpu test in
test_static_kv.py checks it under the CUDA graphs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.compat import import_diffsynth

import_diffsynth()

from gc25d_core.deploy.runtime import RuntimeOptions  # noqa: E402
from gc25d_core.deploy.session import open_session  # noqa: E402
from gc25d_core.flow import DEPLOY_AXIS  # noqa: E402
from gc25d_core.models.configs import DEPLOY_CAUSAL, CausalConfig  # noqa: E402
from gc25d_core.models.sampler import CausalStreamer  # noqa: E402
from tests.deploy.rollout import streamed_rollout  # noqa: E402
from tests.models.tiny import make_model  # noqa: E402


@pytest.mark.parametrize("static_kv", [False, True], ids=["kv_cache", "static_kv"])
def test_deferred_commit_gives_the_same_cells_and_cache(static_kv):
    model = make_model(seed=0)
    spec = CausalConfig(sink=1, window=3, rope_cap=4)  # past the cap and a full window in 9 cells
    ref, ref_cache = streamed_rollout(model, spec, 9, static_kv=static_kv)
    streamer = CausalStreamer(model, spec, DEPLOY_AXIS.timesteps, static_kv=static_kv, defer_commit=True)
    got, cache = streamed_rollout(model, spec, 9, streamer=streamer)
    assert streamer.deferred is not None and streamer.deferred.cell == 8  # the last cell's is pending
    assert cache.cells[-1] == 7  # cell 8 is committed by the next step (or by commit())
    streamer.commit()
    assert streamer.deferred is None
    assert torch.equal(got, ref)
    assert cache.cells == ref_cache.cells
    for layer in range(cache.num_layers):
        kv, ref_kv = cache.layer_kv(layer), ref_cache.layer_kv(layer)
        assert kv is not None and ref_kv is not None
        assert torch.equal(kv[0], ref_kv[0]) and torch.equal(kv[1], ref_kv[1])


def test_deferred_and_folded_commit_do_not_combine():
    with pytest.raises(ValueError, match="fold_commit and defer_commit"):
        CausalStreamer(
            make_model(seed=0), DEPLOY_CAUSAL, DEPLOY_AXIS.timesteps, fold_commit=True, defer_commit=True
        )


def test_a_deferred_commit_session_gives_the_exact_sessions_latents_and_frames(tiny_export, deploy_cfg):
    """The runtime commits each cell after its decode and returns; the cell is in the cache when
    the next one starts (the same latents and frames as the exact session, every cell)."""
    rng = np.random.default_rng(0)
    blocks = [np.array([rng.integers(0, 9), rng.integers(0, 2), 0, 0, 0], np.uint8) for _ in range(5)]

    def run(**opts):
        s = open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(seed=1, **opts))
        frames = list(s.start())
        outs = [s.step(b) for b in blocks]
        streamer = s.runtime.streamer
        assert streamer.deferred is None  # the runtime ran it before returning the cell
        assert streamer.cache is not None and streamer.cache.cells[-1] == len(blocks)
        frames += [f for o in outs for f in o.out.frames]
        return torch.cat([o.out.latent for o in outs], dim=2), np.concatenate(frames)

    lat, frames = run()
    lat_d, frames_d = run(defer_commit=True)
    assert torch.equal(lat_d, lat)
    assert np.array_equal(frames_d, frames)


def test_a_timed_deferred_commit_is_the_commit_part_not_taken_from_the_host_part(tiny_export, deploy_cfg):
    s = open_session(
        tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(decode=False, defer_commit=True)
    )
    s.runtime.timing = True
    s.start()
    for _ in range(3):
        t = s.step(np.array([1, 0, 0, 0, 0], np.uint8)).out.times
        assert t.commit > 0 and t.host > 0 and len(t.forwards) == 5
        assert t.total >= t.denoise + t.commit + t.decode


def test_the_side_stream_switch_needs_a_cuda_device(tiny_export, deploy_cfg):
    s = open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(decode=False))
    with pytest.raises(ValueError, match="decode_stream needs a CUDA device"):
        s.runtime.set_decode_stream(True)
    s.runtime.set_decode_stream(False)  # off is always possible
    assert not s.runtime.options.decode_stream and s.runtime.decode_stream is None


@pytest.mark.gpu
def test_cuda_side_stream_switched_mid_session_keeps_every_frame_in_order(tiny_export, deploy_cfg):
    """The CLI's CUDA path (graphs, lean bf16 decode + its graph, the commit deferred and beside
    the decode) with the page's side-stream switch flipped on and off mid-session (then the decode
    and the commit each on a side stream): every cell's frames come out once, in order, the same
    frames and latents as the session that never switched."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(1)
    blocks = [np.array([rng.integers(0, 9), rng.integers(0, 2), 0, 0, 0], np.uint8) for _ in range(12)]
    opts = RuntimeOptions(
        cuda_graphs=True,
        decode_fast=True,
        decode_dtype="bf16",
        decode_graph=True,
        defer_commit=True,
        commit_stream=True,
    )

    def run(switch: dict[int, bool]):
        s = open_session(tiny_export, deploy_cfg, device="cuda", options=opts)
        frames = list(s.start())
        lat = []
        for i, b in enumerate(blocks):
            if i in switch:
                s.runtime.set_decode_stream(switch[i])
            o = s.step(b)
            frames += o.out.frames
            lat.append(o.out.latent.float().cpu())
        frames += s.runtime.flush()
        assert s.runtime.decoder.graph_disabled is None
        return np.concatenate(frames), torch.cat(lat, dim=2)

    plain, lat = run({})
    switched, lat_s = run({3: True, 7: False, 9: True})  # ends on the side stream: flush() has the last
    assert plain.shape[0] == switched.shape[0] == 1 + 4 * len(blocks)
    assert np.array_equal(switched, plain)
    assert torch.equal(lat_s, lat)


def test_the_commit_beside_the_decode_needs_the_deferred_commit(tiny_export, deploy_cfg):
    with pytest.raises(ValueError, match="commit_stream needs defer_commit"):
        open_session(tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(commit_stream=True))
    s = open_session(
        tiny_export, deploy_cfg, device="cpu", options=RuntimeOptions(defer_commit=True, commit_stream=True)
    )
    assert s.runtime.commit_stream is None and any("commit_stream" in n for n in s.runtime.notes)


@pytest.mark.gpu
def test_cuda_commit_beside_the_decode_gives_the_deferred_sessions_cells(tiny_export, deploy_cfg):
    """The commit on its own CUDA stream, beside the decode (graphs, lean decode + its graph): the
    same latents and frames as the deferred commit on the one stream, every cell."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(2)
    blocks = [np.array([rng.integers(0, 9), rng.integers(0, 2), 0, 0, 0], np.uint8) for _ in range(24)]
    base = dict(cuda_graphs=True, decode_fast=True, decode_dtype="bf16", decode_graph=True, defer_commit=True)

    def run(**extra):
        s = open_session(tiny_export, deploy_cfg, device="cuda", options=RuntimeOptions(**base, **extra))
        assert (s.runtime.commit_stream is not None) == bool(extra)
        frames = list(s.start())
        outs = [s.step(b) for b in blocks]
        frames += [f for o in outs for f in o.out.frames]
        torch.cuda.synchronize()
        return torch.cat([o.out.latent.float().cpu() for o in outs], dim=2), np.concatenate(frames)

    lat, frames = run()
    lat_c, frames_c = run(commit_stream=True)
    assert torch.equal(lat_c, lat)
    assert np.array_equal(frames_c, frames)
