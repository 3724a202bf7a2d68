"""GcDiT bidirectional forward: zero-init equivalence with DiffSynth's model_fn_wan_video, batching,
text layouts, checkpointing, per-cell time embedding, input checks."""

from __future__ import annotations

import pytest
import torch

from .tiny import make_inputs, make_model


@pytest.fixture(scope="module")
def fresh_model():
    """Sem-cond last layer at zero, as after install."""
    return make_model(seed=7, active_sem=False)


def _plain(model, latents, t, context):
    from diffsynth.pipelines.wan_video import model_fn_wan_video

    return model_fn_wan_video(
        dit=model,
        latents=latents,
        timestep=torch.tensor([t]),
        context=context,
        fuse_vae_embedding_in_latents=True,
    )


@pytest.mark.parametrize("t", [500.0, 937.5, 1000.0])
def test_zero_init_bit_identical_to_model_fn_wan_video(fresh_model, t):
    latents, context, ids = make_inputs(5, seed=1, per_cell_text=False)
    with torch.no_grad():
        ref = _plain(fresh_model, latents, t, context)
        assert torch.equal(fresh_model(latents, t, context, ids), ref)
        assert torch.equal(fresh_model(latents, torch.tensor([t]), context), ref)


def test_zero_init_equivalence_with_gradient_checkpointing(fresh_model):
    latents, context, ids = make_inputs(3, seed=2, per_cell_text=False)
    fresh_model.train()
    try:
        ref = _plain(fresh_model, latents, 400.0, context)
        ref[:, :, 1:].pow(2).mean().backward()
        ref_grads = {n: p.grad.clone() for n, p in fresh_model.named_parameters() if p.grad is not None}
        fresh_model.zero_grad(set_to_none=True)
        out = fresh_model(latents, 400.0, context, ids, use_gradient_checkpointing=True)
        out[:, :, 1:].pow(2).mean().backward()
        assert torch.equal(out, ref)
        for name, g in ref_grads.items():
            torch.testing.assert_close(fresh_model.get_parameter(name).grad, g, rtol=1e-5, atol=1e-7)
        # the zero last layer still passes gradient to itself: sem cond learns from step 1
        assert fresh_model.gc_sem_cond.proj_out.weight.grad.abs().sum() > 0
    finally:
        fresh_model.zero_grad(set_to_none=True)
        fresh_model.eval()


def test_sem_cond_changes_output_and_matches_pooled_path(tiny_model):
    latents, context, ids = make_inputs(3, seed=3, per_cell_text=False)
    with torch.no_grad():
        plain = _plain(tiny_model, latents, 500.0, context)
        out = tiny_model(latents, 500.0, context, ids)
        from gc25d_core.models.sem_cond import pooled_onehot

        pooled = tiny_model(latents, 500.0, context, sem_pooled=pooled_onehot(ids, "parts"))
    assert not torch.allclose(out, plain)
    assert torch.equal(out, pooled)


def test_batch_with_per_sample_timesteps(tiny_model):
    latents, context, ids = make_inputs(3, seed=4, batch=2, per_cell_text=False)
    ts = torch.tensor([200.0, 800.0])
    with torch.no_grad():
        both = tiny_model(latents, ts, context, ids)
        for i in range(2):
            one = tiny_model(latents[i : i + 1], ts[i : i + 1], context[i : i + 1], ids[i : i + 1])
            torch.testing.assert_close(both[i : i + 1], one, rtol=1e-5, atol=1e-5)


def test_text_layouts(tiny_model):
    latents, context, ids = make_inputs(4, seed=5, per_cell_text=False)
    with torch.no_grad():
        shared = tiny_model(latents, 300.0, context, ids)
        per_cell = tiny_model(latents, 300.0, context[:, None].expand(1, 4, -1, -1), ids)
        torch.testing.assert_close(per_cell, shared, rtol=1e-5, atol=1e-5)
        bank = torch.randn(1, 3, *context.shape[1:])
        index = torch.tensor([[2, 0, 0, 1]])
        via_bank = tiny_model(latents, 300.0, bank, ids, context_index=index)
        expanded = tiny_model(latents, 300.0, bank[:, index[0]], ids)
        torch.testing.assert_close(via_bank, expanded, rtol=0, atol=0)
        # per-cell prompts matter: changing cell 3's prompt changes cell 3
        other = tiny_model(latents, 300.0, bank, ids, context_index=torch.tensor([[2, 0, 0, 2]]))
    assert not torch.allclose(other[:, :, 3], via_bank[:, :, 3])
    with pytest.raises(ValueError, match="prompts for 4 cells"):
        tiny_model(latents, 300.0, bank, ids)


def test_per_cell_time_embedding_matches_per_token():
    a = make_model(seed=9)
    b = make_model(seed=9, per_cell_time=True)
    latents, context, ids = make_inputs(4, seed=6)
    t = torch.tensor([[0.0, 990.0, 500.0, 10.0]])
    with torch.no_grad():
        torch.testing.assert_close(
            b(latents, t, context, ids), a(latents, t, context, ids), rtol=1e-5, atol=1e-5
        )


def test_per_cell_modulation_trains_like_per_token():
    """per_cell_time hands the blocks t_mod per cell ([B, G, 6, dim], broadcast over each cell's
    tokens): the full forward's output and every parameter gradient, and the teacher-forcing
    forward (42 groups), match the per-token layout."""
    from gc25d_core.models.configs import FULL_CAUSAL

    a = make_model(seed=9)
    b = make_model(seed=9, per_cell_time=True)
    latents, context, ids = make_inputs(4, seed=6)
    t = torch.tensor([[0.0, 990.0, 500.0, 10.0]])
    grads = []
    for m in (a, b):
        m.train()
        out = m(latents, t, context, ids)
        out.pow(2).mean().backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(n.endswith("modulation") for n in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)
    with torch.no_grad():
        tf = [
            m.forward_teacher_forcing(latents, latents, 500.0, context, ids, causal=FULL_CAUSAL)
            for m in (a, b)
        ]
    torch.testing.assert_close(tf[1], tf[0], rtol=1e-5, atol=1e-5)
    b.enable_compile(backend="eager")  # dynamo traces the grouped views in the block body
    try:
        with torch.no_grad():
            torch.testing.assert_close(
                b(latents, t, context, ids), a(latents, t, context, ids), rtol=1e-5, atol=1e-5
            )
    finally:
        torch._dynamo.reset()


def test_block_modulation_groups_must_divide_the_tokens():
    from gc25d_core.models.gcdit import block_forward

    model = make_model(seed=9)
    x = torch.zeros(1, 10, model.dim)
    with pytest.raises(ValueError, match="10 tokens do not split into 3 modulation groups"):
        block_forward(model.blocks[0], x, None, torch.zeros(1, 3, 6, model.dim), None, 0)  # type: ignore[arg-type]


def test_fused_rmsnorm_matches_default():
    a = make_model(seed=9)
    b = make_model(seed=9, fused_rmsnorm=True)
    assert b.blocks[0].self_attn.norm_q.use_torch_norm and not a.blocks[0].self_attn.norm_q.use_torch_norm
    latents, context, ids = make_inputs(3, seed=8)
    with torch.no_grad():
        torch.testing.assert_close(
            b(latents, 700.0, context, ids), a(latents, 700.0, context, ids), rtol=1e-5, atol=1e-5
        )


def test_input_checks(tiny_model):
    latents, context, ids = make_inputs(3, seed=7, per_cell_text=False)
    with torch.no_grad():
        with pytest.raises(ValueError, match="must be even"):
            tiny_model(latents[..., :5], 500.0, context)
        with pytest.raises(ValueError, match="does not match the patch grid"):
            tiny_model(latents, 500.0, context, ids[:, :5])
        with pytest.raises(ValueError, match=r"\(B, N\)"):
            tiny_model(latents, torch.zeros(1, 2), context)


def test_sem_id_check_can_move_to_the_host(tiny_model):
    """By default a raw id outside the vocab raises in the forward (one device sync on GPU); with
    ``check_sem_ids`` off (the SFT checks on the host) it counts as UNKNOWN, like a 255 there."""
    from gc25d_core.vocab import UNKNOWN

    latents, context, ids = make_inputs(3, seed=8, per_cell_text=False)
    bad, unknown = ids.clone(), ids.clone()
    bad[0, 2, :8, :8], unknown[0, 2, :8, :8] = 8, UNKNOWN  # 8: not a 'parts' id
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"values \[8\]"):
            tiny_model(latents, 500.0, context, bad)
        tiny_model.check_sem_ids = False
        try:
            out_bad = tiny_model(latents, 500.0, context, bad)
        finally:
            tiny_model.check_sem_ids = True
        out_unknown = tiny_model(latents, 500.0, context, unknown)
        out_valid = tiny_model(latents, 500.0, context, ids)
    assert torch.equal(out_bad, out_unknown)
    assert not torch.equal(out_bad, out_valid)  # the pool really changed


def test_fa4_backend_plumbing_matches_sdpa(monkeypatch):
    """attn_backend='fa4' hands the unmasked self-attention to flash_attn.cute.flash_attn_func in
    its [B, S, H, D] layout, once per block. A stand-in for the package (SDPA in that layout; the
    real kernels run only on the GPU, tests/models/test_gpu_models.py) checks our side: layouts,
    reshapes, the call per layer, and that masked attention never goes there."""
    import sys
    import types

    import torch.nn.functional as F

    from gc25d_core.models.configs import FULL_CAUSAL

    calls: list[tuple[int, ...]] = []

    def flash_attn_func(q, k, v):
        calls.append(tuple(q.shape))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2), None

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)

    model = make_model(seed=9).to(torch.bfloat16)
    latents, context, ids = make_inputs(3, seed=9, per_cell_text=False)
    latents, context = latents.bfloat16(), context.bfloat16()
    with torch.no_grad():
        ref = model(latents, 500.0, context, ids)
        model.attn_backend = "fa4"
        got = model(latents, 500.0, context, ids)
        assert calls == [(1, 3 * 2 * 3, 2, 48)] * 2  # one call per block: 3 cells x 2x3 tokens, 2 heads
        model.forward_teacher_forcing(latents, latents, 500.0, context, ids, causal=FULL_CAUSAL)
        assert len(calls) == 2  # masked attention stays on SDPA
    torch.testing.assert_close(got, ref)
    model.enable_compile(backend="eager")  # dynamo traces the block; the FA4 call is a graph break
    try:
        with torch.no_grad():
            compiled = model(latents, 500.0, context, ids)
    finally:
        torch._dynamo.reset()  # no compiled code of this model left for other tests
    assert len(calls) == 4
    torch.testing.assert_close(compiled, ref)
    with pytest.raises(TypeError, match="bf16/fp16"):
        from gc25d_core.models.fa4 import fa4_attention

        fa4_attention(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), torch.zeros(1, 4, 8), 2)


def test_fa4_backend_needs_a_cuda_device():
    from gc25d_core.models.fa4 import check_fa4

    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        check_fa4("cpu")


def test_flash_attn_4_does_not_pass_for_flash_attn_2_in_diffsynth(monkeypatch):
    """flash-attn-4's package is named ``flash_attn`` too, without ``flash_attn_func``: after
    ``import_diffsynth`` DiffSynth's Wan attention must not take its FA2 branch (it raised
    AttributeError on the H200), while a real FA2 keeps it."""
    import types

    from diffsynth.models import wan_video_dit

    from gc25d_core.compat import import_diffsynth, repair_fa2_probe

    monkeypatch.setattr(wan_video_dit, "FLASH_ATTN_2_AVAILABLE", True)
    monkeypatch.setattr(wan_video_dit, "FLASH_ATTN_3_AVAILABLE", False)
    monkeypatch.setattr(wan_video_dit, "flash_attn", types.ModuleType("flash_attn"), raising=False)
    q, k, v = torch.randn(3, 1, 5, 2 * 4).unbind(0)
    with pytest.raises(AttributeError, match="flash_attn_func"):
        wan_video_dit.flash_attention(q, k, v, num_heads=2)
    import_diffsynth()
    assert wan_video_dit.FLASH_ATTN_2_AVAILABLE is False
    want = wan_video_dit.flash_attention(q, k, v, num_heads=2, compatibility_mode=True)
    torch.testing.assert_close(wan_video_dit.flash_attention(q, k, v, num_heads=2), want)

    fa2 = types.ModuleType("flash_attn")
    fa2.flash_attn_func = lambda *a: None  # type: ignore[attr-defined]
    real = types.SimpleNamespace(FLASH_ATTN_2_AVAILABLE=True, flash_attn=fa2)
    repair_fa2_probe(real)  # type: ignore[arg-type]
    assert real.FLASH_ATTN_2_AVAILABLE is True
