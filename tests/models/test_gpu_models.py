"""GPU checks of the same invariants (CUDA kernels: SDPA flash/efficient, compiled flex attention)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gc25d_core.models.configs import DEPLOY_CAUSAL, FULL_CAUSAL, CausalConfig

from .tiny import LATENT_HW, kv_cell_output, make_inputs, make_model

pytestmark = pytest.mark.gpu

WINDOW = CausalConfig(sink=1, window=3, rope_cap=None)


@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return make_model(seed=0).cuda()


def _cuda(*ts):
    return [t.cuda() for t in ts]


def test_cuda_zero_init_matches_model_fn():
    from diffsynth.pipelines.wan_video import model_fn_wan_video

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = make_model(seed=3, active_sem=False).cuda()
    latents, context, ids = _cuda(*make_inputs(5, seed=1, per_cell_text=False))
    with torch.no_grad():
        ref = model_fn_wan_video(
            dit=model,
            latents=latents,
            timestep=torch.tensor([500.0], device="cuda"),
            context=context,
            fuse_vae_embedding_in_latents=True,
        )
        torch.testing.assert_close(model(latents, 500.0, context, ids), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [FULL_CAUSAL, WINDOW], ids=["full", "window"])
def test_cuda_teacher_forcing_equals_kv_cache(cuda_model, spec):
    n = 6
    clean, context, ids = _cuda(*make_inputs(n, seed=15))
    noisy = torch.randn_like(clean)
    t = torch.tensor([[0.0, 950.0, 800.0, 600.0, 350.0, 120.0]], device="cuda")
    with torch.no_grad():
        tf = cuda_model.forward_teacher_forcing(clean, noisy, t, context, ids, causal=spec)
        i = n - 1
        out = kv_cell_output(cuda_model, clean, noisy, t, context, ids, spec, i)
    torch.testing.assert_close(out, tf[:, :, i : i + 1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [{}, {"USE_TMA": True}], ids=["default", "tma"])
def test_cuda_compiled_flex_matches_sdpa(cuda_model, options):
    clean, context, ids = _cuda(*make_inputs(21, seed=14))
    noisy = torch.randn_like(clean)
    with torch.no_grad():
        ref = cuda_model.forward_teacher_forcing(clean, noisy, 600.0, context, ids, causal=DEPLOY_CAUSAL)
        cuda_model.attn_backend, cuda_model.flex_options = "flex", options
        try:
            got = cuda_model.forward_teacher_forcing(clean, noisy, 600.0, context, ids, causal=DEPLOY_CAUSAL)
        finally:
            cuda_model.attn_backend, cuda_model.flex_options = "sdpa", {}
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


def test_cuda_bf16_rollout_runs(cuda_model):
    from gc25d_core.models.sampler import kv_rollout

    model = make_model(seed=4).cuda().to(torch.bfloat16)
    latents, context, ids = _cuda(*make_inputs(23, seed=2, per_cell_text=False))
    with torch.no_grad():
        out = kv_rollout(
            model,
            latents[:, :, :1].bfloat16(),
            23,
            (1000.0, 750.0, 500.0, 250.0),
            spec=DEPLOY_CAUSAL,
            context=context.bfloat16(),
            sem_ids=ids,
            generator=torch.Generator(device="cuda").manual_seed(0),
        )
    assert out.shape == (1, 48, 23, *LATENT_HW) and torch.isfinite(out.float()).all()


def test_cuda_lean_vae_channels_last_matches_diffsynth_encode():
    """The latents job's GPU path (lean ops + channels-last-3d + on-device batch, where the fused RMS
    norm actually runs) against DiffSynth's own encode of the same clips, same weights."""
    import copy

    from gc25d_core.models.vae import build_vae, encode_on_device, lean_vae_ops, to_channels_last_3d

    torch.manual_seed(0)
    ref = build_vae(tiny=True).to("cuda")
    fast = lean_vae_ops(copy.deepcopy(ref))
    to_channels_last_3d(fast)
    video = torch.rand(2, 3, 9, 64, 96, device="cuda") * 2 - 1
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            want = ref.encode(video, device="cuda", tiled=False).cuda()
            got = encode_on_device(fast, video.contiguous(memory_format=torch.channels_last_3d), "cuda")
    finally:
        torch.backends.cudnn.allow_tf32 = True
    assert got.shape == want.shape == (2, 48, 3, 4, 6)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.fa4
def test_cuda_fa4_matches_sdpa_forward_and_backward():
    """FlashAttention-4 (optional flash-attn-4 package, sm90+) against SDPA on a bf16 model with
    head_dim 128 (the 5B's): outputs and parameter gradients agree to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gc25d_core.models.fa4 import check_fa4

    check_fa4("cuda")  # fails (does not skip) without the package: this test is what carrying it is for
    model = make_model(seed=6, dim=256, num_heads=2).cuda().to(torch.bfloat16).train()
    latents, context, ids = _cuda(*make_inputs(9, seed=6, per_cell_text=False))
    latents, context = latents.bfloat16(), context.bfloat16()
    outs, grads = [], []
    for backend in ("sdpa", "fa4"):
        model.attn_backend = backend
        model.zero_grad(set_to_none=True)
        out = model(latents, 500.0, context, ids)
        out.float().pow(2).mean().backward()
        outs.append(out.float())
        grads.append(torch.cat([p.grad.float().flatten() for p in model.blocks.parameters()]))
    model.attn_backend = "sdpa"
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)
    rel = (grads[1] - grads[0]).norm() / grads[0].norm()
    assert rel < 2e-2, rel


@pytest.mark.fa4
def test_cuda_flex_flash_backend_matches_sdpa_teacher_forcing_forward_and_backward():
    """Flex attention's FlashAttention-4 backend (``flex_options: {BACKEND: FLASH}``, the stage-1 / 2
    speed option) over the teacher-forcing block mask against SDPA with the dense mask, bf16, head_dim
    128: outputs and parameter gradients agree to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gc25d_core.models.configs import FULL_CAUSAL
    from gc25d_core.models.fa4 import check_fa4

    check_fa4("cuda")
    model = make_model(seed=7, dim=256, num_heads=2).cuda().to(torch.bfloat16).train()
    clean, context, ids = _cuda(*make_inputs(9, seed=7))
    clean, context = clean.bfloat16(), context.bfloat16()
    noisy = torch.randn_like(clean)
    outs, grads = [], []
    for backend, options in (("sdpa", {}), ("flex", {"BACKEND": "FLASH"})):
        model.attn_backend, model.flex_options = backend, options
        model.zero_grad(set_to_none=True)
        out = model.forward_teacher_forcing(clean, noisy, 500.0, context, ids, causal=FULL_CAUSAL)
        out.float().pow(2).mean().backward()
        outs.append(out.float())
        grads.append(torch.cat([p.grad.float().flatten() for p in model.blocks.parameters()]))
    model.attn_backend, model.flex_options = "sdpa", {}
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)
    rel = (grads[1] - grads[0]).norm() / grads[0].norm()
    assert rel < 2e-2, rel


@pytest.mark.fa4
def test_cuda_fa4_kv_step_under_graphs_matches_sdpa():
    """FlashAttention-4 as the static KV cache's attention (deploy's ``--kv-attention fa4``): a bf16
    stream of 26 cells (past a full window and the RoPE cap, so every fill level) with its forwards
    replayed as CUDA graphs, against the same stream with SDPA: every forward replayed, the latents
    within bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.models.causal import sdpa
    from gc25d_core.models.fa4 import check_fa4, fa4_attention
    from gc25d_core.models.kv_graphs import GraphedKVForward
    from gc25d_core.models.sampler import CausalStreamer
    from tests.deploy.rollout import streamed_rollout

    check_fa4("cuda")
    model = make_model(seed=8, dim=256, num_heads=2).cuda().to(torch.bfloat16)
    model.check_sem_ids = False  # as DeployRuntime leaves it: the ids are checked on the host
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    outs, runners = [], []
    for attention in (None, fa4_attention):
        graphed = GraphedKVForward(model)
        streamer = CausalStreamer(
            model, spec, DEPLOY_AXIS.timesteps, forward=graphed, static_kv=True, static_attention=attention
        )
        x0, cache = streamed_rollout(model, spec, 26, streamer=streamer, device="cuda", dtype=torch.bfloat16)
        assert cache.attn_fn is (attention or sdpa)
        outs.append(x0.float())
        runners.append(graphed)
    for graphed in runners:
        assert graphed.disabled is None and graphed.replays > 0
    assert runners[1].replays == runners[0].replays
    rel = (outs[1] - outs[0]).norm() / outs[0].norm()
    print(f"fa4 vs sdpa KV step under graphs: relative latent error {rel:.2e}")
    assert rel < 2e-2, rel


def test_cuda_graphs_of_a_model_that_checks_its_ids_stay_eager_and_say_why():
    """The vocab check of raw ids syncs the device, which no capture can hold: the graphed forward
    runs such a model eagerly (the same cells) and names the check, rather than failing mid-capture."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.models.kv_graphs import GraphedKVForward
    from gc25d_core.models.sampler import CausalStreamer
    from tests.deploy.rollout import streamed_rollout

    model = make_model(seed=8).cuda()
    assert model.check_sem_ids  # a fresh model checks
    spec = CausalConfig(sink=1, window=3, rope_cap=4)
    ref, _ = streamed_rollout(model, spec, 6, device="cuda")
    graphed = GraphedKVForward(model)
    streamer = CausalStreamer(model, spec, DEPLOY_AXIS.timesteps, forward=graphed, static_kv=True)
    got, _ = streamed_rollout(model, spec, 6, streamer=streamer, device="cuda")
    assert graphed.replays == 0 and graphed.disabled is not None and "check_sem_ids" in graphed.disabled
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


def test_cuda_compiled_tiny_vae_fit_matches_the_eager_fit():
    """``vae.fit.compile`` on CUDA (torch.compile, CUDA graphs): a few steps give the eager fit's
    losses and weights within float rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import numpy as np

    from gc25d_core.models.vae_fit import fit_tiny_vae

    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (9, 64, 64, 3), dtype=np.uint8) for _ in range(2)]
    kw = {"steps": 4, "batch": 2, "frames": 5, "seed": 0, "dim": 8, "dec_dim": 8, "device": "cuda"}
    losses: dict[bool, list[float]] = {False: [], True: []}
    fits = {
        c: fit_tiny_vae(clips, compile=c, log=lambda s, v, c=c: losses[c].append(v), **kw)[0]
        for c in (False, True)
    }
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-3)
    # Adam moves a weight by at most about lr a step, even on a gradient of rounding noise: the bound
    bound = kw["steps"] * 5e-4  # fit_tiny_vae's default lr
    for (name, a), b in zip(fits[False].model.named_parameters(), fits[True].model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=bound, msg=name)


def test_cuda_tiny_vae_fit_fast_ops_and_a_continued_fit_match_the_plain_fit(tmp_path):
    """On CUDA: ``vae.fit.fast_ops`` (lean ops, channels-last-3d convs) gives the plain fit's losses
    and weights within float rounding (with ``vae.fit.bf16`` the losses within bfloat16's), and a
    fit continued from its state file (2 steps, then 4) the weights of the 4-step fit in one go
    within the same rounding (cuDNN's backward is not bitwise run to run, so no closer)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import numpy as np

    from gc25d_core.models.vae_fit import fit_tiny_vae

    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (9, 64, 64, 3), dtype=np.uint8) for _ in range(2)]
    kw = {"batch": 2, "frames": 5, "seed": 0, "dim": 8, "dec_dim": 8, "device": "cuda"}
    losses: dict[bool, list[float]] = {False: [], True: []}
    fits = {
        f: fit_tiny_vae(clips, steps=4, fast_ops=f, log=lambda s, v, f=f: losses[f].append(v), **kw)[0]
        for f in (False, True)
    }
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-3)
    bf16: list[float] = []
    fit_tiny_vae(clips, steps=4, bf16=True, fast_ops=True, log=lambda s, v: bf16.append(v), **kw)
    np.testing.assert_allclose(bf16, losses[False], rtol=2e-2)  # bfloat16's 8 bits of mantissa
    state = tmp_path / "fit.state.safetensors"
    fit_tiny_vae(clips, steps=2, state=state, **kw)
    continued, summary = fit_tiny_vae(clips, steps=4, state=state, state_must_match=True, **kw)
    assert summary["resumed_from"] == 2
    bound = 4 * 5e-4  # Adam moves a weight by at most about lr a step, even on rounding noise
    plain = dict(fits[False].model.named_parameters())
    for other in (fits[True], continued):
        for name, b in other.model.named_parameters():
            torch.testing.assert_close(b, plain[name], rtol=0, atol=bound, msg=name)


def test_cuda_class_weighted_tiny_vae_fit_matches_the_cpu_fit():
    """``vae.fit.class_weight`` on CUDA (the `small` preset's setting): the windows' ids are cut on the
    device beside their frames, so the weighted losses equal the CPU fit's within float rounding (with
    fast ops and bf16, within bfloat16's), and differ from the plain loss's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import numpy as np

    from gc25d_core.models.vae_fit import fit_tiny_vae

    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (9, 64, 64, 3), dtype=np.uint8) for _ in range(2)]
    ids = []
    for clip in clips:
        c = np.full((9, 64, 64), 2, np.uint8)  # a ground of one class and a small square of another
        c[:, 20:28, 30:38] = 10
        ids.append(c)
        clip[:, 20:28, 30:38] = 255  # a white square, so that its error is not the ground's
    kw = {"steps": 3, "batch": 2, "frames": 5, "seed": 0, "dim": 8, "dec_dim": 8}
    losses: dict[str, list[float]] = {}

    def fit(name: str, **extra: Any) -> None:
        losses[name] = []
        fit_tiny_vae(clips, log=lambda s, v: losses[name].append(v), **kw, **extra)

    weighted = {"classes": ids, "class_weight": 0.5}
    fit("cpu", device="cpu", **weighted)
    fit("cuda", device="cuda", **weighted)
    fit("cuda fast bf16", device="cuda", fast_ops=True, bf16=True, **weighted)
    fit("cuda plain", device="cuda")
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-3)
    np.testing.assert_allclose(losses["cuda fast bf16"], losses["cpu"], rtol=2e-2)
    assert abs(losses["cuda plain"][0] - losses["cuda"][0]) > 1e-2 * losses["cuda"][0]
