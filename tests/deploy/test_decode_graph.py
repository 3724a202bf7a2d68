"""The live decode's CUDA graph (``StreamingDecoder(graph=True)``, the runtime's ``decode_graph``):
it captures (the VAE's CPU mean / std no longer stop it), replays with the eager frames, and a new
clip (``reset``, a new session) replays the same graph from its third cell."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.models.vae import StreamingDecoder, build_vae, decode_copy


def _clip(dec: StreamingDecoder, z: torch.Tensor) -> list[torch.Tensor]:
    return [dec.push(z[:, :, i : i + 1]).cpu() for i in range(z.shape[2])]


def test_a_reset_decoder_decodes_a_new_clip_like_a_fresh_one():
    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    z1, z2 = torch.randn(1, 48, 4, 2, 3), torch.randn(1, 48, 5, 2, 3)
    dec = StreamingDecoder(vae)
    _clip(dec, z1)
    dec.reset()
    assert dec.cells == 0
    for got, want in zip(_clip(dec, z2), _clip(StreamingDecoder(vae), z2), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_graph_captures_and_replays_the_eager_frames_across_clips():
    torch.manual_seed(0)
    vae = decode_copy(build_vae(tiny=True).cuda(), torch.bfloat16, fast=True)
    z1, z2 = torch.randn(1, 48, 6, 4, 6).cuda(), torch.randn(1, 48, 7, 4, 6).cuda()
    graphed = StreamingDecoder(vae, dtype=torch.bfloat16, graph=True)
    got1 = _clip(graphed, z1)
    assert graphed.graph_disabled is None, graphed.graph_disabled
    assert graphed.replays == 4  # cells 2..5
    graph = graphed._graph
    graphed.reset()  # a new session: the same graph, fed by the new clip's eager cells
    got2 = _clip(graphed, z2)
    assert graphed._graph is graph and graphed.replays == 4 + 5 and graphed.graph_disabled is None
    for z, got in ((z1, got1), (z2, got2)):
        want = _clip(StreamingDecoder(vae, dtype=torch.bfloat16), z)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-2)  # the same kernels: expect 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_frames_converted_on_the_gpu_equal_the_host_conversion():
    from gc25d_core.models.vae import video_to_frames

    torch.manual_seed(0)
    video = torch.randn(3, 4, 48, 80) * 0.7
    video[0, 0, 0, :4] = torch.tensor([-1.0, 1.0, 0.5 / 127.5 - 1, 1.5 / 127.5 - 1])  # ties: half to even
    host = video_to_frames(video)
    assert (video_to_frames(video.cuda()) == host).all()
