"""WanVideoVAE38 wrapper: tiny random variant of the same class, fp32 encode, full key layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gc25d_core.models.vae import (
    VAE38_KEY_HASH,
    TinyWanVideoVAE38,
    build_vae,
    encode_frames,
    encode_video,
    frames_to_video,
    load_vae,
    vae_key_hash,
)


def test_tiny_vae_encodes_like_the_real_layout():
    from diffsynth.models.wan_video_vae import WanVideoVAE38

    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    assert isinstance(vae, WanVideoVAE38) and isinstance(vae, TinyWanVideoVAE38)
    frames = np.random.default_rng(0).integers(0, 256, (5, 64, 96, 3), dtype=np.uint8)
    z = encode_frames(vae, frames)
    assert z.shape == (48, 2, 4, 6) and z.dtype == torch.float32 and torch.isfinite(z).all()
    video = frames_to_video(frames)
    assert video.shape == (3, 5, 64, 96) and video.min() >= -1 and video.max() <= 1
    # the anchor frame alone encodes to the first latent cell (causal in time)
    z0 = encode_video(vae, video[:, :1])[0]
    torch.testing.assert_close(z0[:, 0], z[:, 0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="T = 1 \\+ 4k"):
        encode_video(vae, video[:, :4])
    with pytest.raises(ValueError, match="uint8"):
        frames_to_video(frames.astype(np.float32))


def test_full_vae_key_layout_matches_registry_hash():
    vae = build_vae(device="meta")
    assert vae_key_hash(vae) == VAE38_KEY_HASH


def test_load_vae_refuses_wrong_digest_and_layout(tmp_path):
    from gc25d_core.models.loading import WeightsError, sha256_file

    vae = build_vae(tiny=True)
    path = tmp_path / "Wan2.2_VAE.pth"
    torch.save(vae.model.state_dict(), path)
    with pytest.raises(WeightsError, match="sha256"):
        load_vae(path, expected_sha256="0" * 64)
    with pytest.raises(WeightsError, match="key hash"):
        load_vae(path, expected_sha256=sha256_file(path))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("n_cache", [None, 1, 2])
@pytest.mark.parametrize("kernel", [1, 3])
def test_lean_causal_conv_matches_diffsynth(kernel, n_cache, channels_last):
    """Same output as DiffSynth's CausalConv3d for every cache length the encoder passes, one layout
    in, the same layout out."""
    from diffsynth.models.wan_video_vae import CausalConv3d

    from gc25d_core.models.vae import LeanCausalConv3d

    torch.manual_seed(kernel)
    ref = CausalConv3d(6, 5, kernel, padding=kernel // 2)
    lean = CausalConv3d(6, 5, kernel, padding=kernel // 2)
    lean.load_state_dict(ref.state_dict())
    lean.__class__ = LeanCausalConv3d
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 6, 4, 7, 9).contiguous(memory_format=fmt)
    cache = None if n_cache is None else torch.randn(2, 6, n_cache, 7, 9)
    with torch.no_grad():
        want, got = ref(x, cache), lean(x, cache)
    assert got.shape == want.shape == (2, 5, 4, 7, 9)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_lean_rms_norm_matches_diffsynth_in_channels_last():
    from diffsynth.models.wan_video_vae import RMS_norm

    from gc25d_core.models.vae import LeanRMSNorm

    for bias in (False, True):
        ref = RMS_norm(16, images=False, bias=bias)
        with torch.no_grad():
            ref.gamma.uniform_(0.5, 1.5)
            if bias:
                ref.bias.normal_()
        lean = RMS_norm(16, images=False, bias=bias)
        lean.load_state_dict(ref.state_dict())
        lean.__class__ = LeanRMSNorm
        x = torch.randn(2, 16, 3, 5, 7)
        x[0, :, 0, 0, 0] = 0.0  # an all-zero channel vector stays zero (no NaN)
        x_cl = x.contiguous(memory_format=torch.channels_last_3d)
        with torch.no_grad():
            want = ref(x)
            got = lean(x_cl)
            got_plain = lean(x)
        assert got.is_contiguous(memory_format=torch.channels_last_3d)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_plain, want, rtol=0, atol=0)  # other layouts: DiffSynth's path


def test_lean_vae_ops_keeps_keys_and_encode():
    import copy

    from gc25d_core.models.vae import LeanCausalConv3d, LeanRMSNorm, lean_vae_ops

    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    lean = lean_vae_ops(copy.deepcopy(vae))
    assert any(type(m) is LeanCausalConv3d for m in lean.modules())
    assert any(type(m) is LeanRMSNorm for m in lean.modules())
    assert vae_key_hash(lean) == vae_key_hash(vae)
    video = torch.rand(2, 3, 9, 64, 96) * 2 - 1
    torch.testing.assert_close(encode_video(lean, video), encode_video(vae, video), rtol=1e-5, atol=1e-5)


def test_encode_on_device_matches_diffsynth_encode_for_a_batch():
    """The job's path (inner model on the batch, no host round trip) = DiffSynth's clip-by-clip encode."""
    from gc25d_core.models.vae import encode_on_device

    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    video = torch.rand(2, 3, 9, 64, 96) * 2 - 1
    with torch.no_grad():
        want = vae.encode(video, device="cpu", tiled=False)
        got = encode_on_device(vae, video, "cpu")
    assert got.shape == want.shape == (2, 48, 3, 4, 6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_streaming_decode_of_21_cells_equals_the_whole_clip_decode():
    """The live runtime's path: one latent cell at a time through the decoder's causal cache, 1 frame
    for cell 0 and 4 per later cell, equals DiffSynth's whole-clip decode to fp32 rounding
    (atol 1e-5 on outputs of about unit size; the same convolutions on the same inputs)."""
    from gc25d_core.models.vae import StreamingDecoder, decode_frames, decode_video, lean_vae_ops

    torch.manual_seed(0)
    vae = lean_vae_ops(build_vae(tiny=True))
    vae.mean, vae.std = torch.randn(48) * 0.1, torch.rand(48) + 0.5  # a non-trivial normalisation
    vae.scale = [vae.mean, 1.0 / vae.std]
    z = torch.randn(1, 48, 21, 2, 3)
    whole = decode_video(vae, z)
    assert whole.shape == (1, 3, 81, 32, 48)
    stream = StreamingDecoder(vae)
    parts = [stream.push(z[:, :, i : i + 1]) for i in range(21)]
    assert [p.shape[2] for p in parts] == [1] + [4] * 20
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=0, atol=1e-5)
    frames = decode_frames(vae, z[0])
    assert frames.shape == (81, 32, 48, 3) and frames.dtype == np.uint8
    with pytest.raises(ValueError, match="latent cell"):
        stream.push(z[:, :, :2])


def test_streaming_decoder_graph_option_stays_eager_on_a_cpu_with_the_same_frames():
    """``graph=True`` (deploy's decode_graph) replays only on a GPU; on a CPU it is the eager path."""
    from gc25d_core.models.vae import StreamingDecoder, decode_copy

    torch.manual_seed(0)
    vae = build_vae(tiny=True)
    z = torch.randn(1, 48, 5, 2, 3)
    ref = StreamingDecoder(vae)
    got = StreamingDecoder(decode_copy(vae, fast=True), graph=True)
    for i in range(5):
        torch.testing.assert_close(
            got.push(z[:, :, i : i + 1]), ref.push(z[:, :, i : i + 1]), rtol=0, atol=1e-5
        )
    assert got.replays == 0 and got.graph_disabled is None


def test_speed_up_vae_on_a_cpu_changes_the_decoder_alone(tiny_cfg):
    """On a CPU the decoder's lean convolutions become oneDNN's (PyTorch's own rule sends a single
    clip to its slower native conv3d) with channels-last weights, and nothing else: the encode of a
    batch of clips stays bit for bit (either change would move it by rounding), the streamed decode
    of one row and of two stays within fp32 rounding of the lean decoder's, and a single row's
    decode no longer runs the native kernel; with the options off nothing changes."""
    import copy

    from torch.profiler import profile

    from gc25d_core.models.vae import (
        LeanCausalConv3d,
        OneDnnCausalConv3d,
        StreamingDecoder,
        lean_vae_ops,
        speed_up_vae,
    )

    torch.manual_seed(0)
    base = build_vae(tiny=True)
    lean = lean_vae_ops(copy.deepcopy(base))
    off_cfg = tiny_cfg.model_copy(
        update={"vae": tiny_cfg.vae.model_copy(update={"channels_last_3d": False, "lean_ops": False})}
    )
    off = speed_up_vae(copy.deepcopy(base), off_cfg, torch.device("cpu"))
    on = speed_up_vae(copy.deepcopy(base), tiny_cfg, torch.device("cpu"))

    def convs(module: torch.nn.Module) -> list[torch.nn.Conv3d]:
        return [m for m in module.modules() if isinstance(m, torch.nn.Conv3d) and m.kernel_size != (1, 1, 1)]

    def laid_out(m: torch.nn.Conv3d) -> bool:
        return m.weight.is_contiguous(memory_format=torch.channels_last_3d) and not m.weight.is_contiguous()

    assert convs(on.model.decoder) and all(
        type(m) is OneDnnCausalConv3d and laid_out(m) for m in convs(on.model.decoder)
    )
    assert all(type(m) is LeanCausalConv3d and not laid_out(m) for m in convs(on.model.encoder))
    assert not any(type(m) is OneDnnCausalConv3d or laid_out(m) for m in convs(off.model))
    video = torch.rand(2, 3, 17, 64, 128) * 2 - 1
    assert torch.equal(encode_video(on, video), encode_video(lean, video))
    for rows in (1, 2):
        z = torch.randn(rows, 48, 6, 4, 8)
        streams = StreamingDecoder(on), StreamingDecoder(lean)
        for k in range(6):
            got, want = (s.push(z[:, :, k : k + 1]) for s in streams)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    def kernels(vae: torch.nn.Module) -> set[str]:
        stream = StreamingDecoder(vae)
        stream.push(torch.randn(1, 48, 1, 4, 8))
        with profile() as prof:
            stream.push(torch.randn(1, 48, 1, 4, 8))
        return {e.key for e in prof.key_averages()}

    assert "aten::slow_conv3d_forward" in kernels(lean)  # why: PyTorch's rule for a single clip
    assert "aten::slow_conv3d_forward" not in kernels(on)
