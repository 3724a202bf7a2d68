"""Causal GcDiT: the visibility / position rule, block-causal invariance, sink/window exclusion,
teacher forcing == KV cache, KV rollout == full causal forward, capped RoPE beyond the cap,
cache contents, rollout gradients."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.models.causal import (
    cell_mask,
    full_sequence_mask,
    group_mask,
    query_time_position,
    rope_time_positions,
    visible,
)
from gc25d_core.models.configs import DEPLOY_CAUSAL, FULL_CAUSAL, CausalConfig
from gc25d_core.models.gcdit import TextContext
from gc25d_core.models.sampler import denoise_cell, kv_rollout
from gc25d_core.models.sem_cond import cell_frame_slice

from .tiny import LATENT_HW, kv_cell_output, make_inputs, make_model, random_ids

AXIS = (1000.0, 750.0, 500.0, 250.0)
SMALL_WINDOW = CausalConfig(sink=1, window=3, rope_cap=None)


# ------------------------------------------------------------------------------------ the rule


def test_visibility_rule_deploy():
    kv = torch.arange(30)
    assert visible(5, kv, DEPLOY_CAUSAL).nonzero().flatten().tolist() == list(range(6))
    at20 = visible(20, kv, DEPLOY_CAUSAL).nonzero().flatten().tolist()
    assert at20 == [0, 1, 2, *range(4, 21)]  # window of 17 = cells 4..20: cell 3 drops out
    at25 = visible(25, kv, DEPLOY_CAUSAL).nonzero().flatten().tolist()
    assert at25 == [0, 1, 2, *range(9, 26)]
    assert visible(25, kv, FULL_CAUSAL).nonzero().flatten().tolist() == list(range(26))


def test_teacher_forcing_mask_structure():
    n = 3
    m = group_mask(n, FULL_CAUSAL, teacher_forcing=True)
    clean_clean, clean_noisy = m[:n, :n], m[:n, n:]
    noisy_clean, noisy_noisy = m[n:, :n], m[n:, n:]
    assert torch.equal(clean_clean, torch.ones(n, n).tril().bool())
    assert not clean_noisy.any()
    assert torch.equal(noisy_clean, torch.ones(n, n).tril(-1).bool())
    assert torch.equal(noisy_noisy, torch.eye(n).bool())
    tok = full_sequence_mask(n, 2, FULL_CAUSAL, teacher_forcing=True)
    assert tok.shape == (12, 12) and tok.diagonal().all()
    cells = torch.arange(4)
    assert torch.equal(cell_mask(cells, cells, SMALL_WINDOW)[3], torch.tensor([True, True, True, True]))


def test_rope_positions_absolute_then_capped():
    cells = torch.arange(21)
    assert torch.equal(rope_time_positions(cells, 20, DEPLOY_CAUSAL), cells)  # up to the cap: absolute
    cached = torch.tensor([0, 1, 2, *range(9, 25)])
    assert rope_time_positions(cached, 25, DEPLOY_CAUSAL).tolist() == [0, 1, 2, *range(4, 20)]
    assert query_time_position(25, DEPLOY_CAUSAL) == 20 and query_time_position(7, DEPLOY_CAUSAL) == 7


def test_causal_config_validation():
    with pytest.raises(ValueError, match="rope_cap"):
        CausalConfig(sink=3, window=17, rope_cap=18)
    with pytest.raises(ValueError, match="needs a window"):
        CausalConfig(sink=0, window=None, rope_cap=20)
    with pytest.raises(ValueError):
        CausalConfig(window=0)
    assert CausalConfig.from_metadata(DEPLOY_CAUSAL.metadata()) == DEPLOY_CAUSAL
    assert CausalConfig.from_metadata(FULL_CAUSAL.metadata()) == FULL_CAUSAL


# ------------------------------------------------------------------------------------ invariance


def _perturb_after(latents, context, ids, j, seed=99):
    g = torch.Generator().manual_seed(seed)
    lat, ctx, sid = latents.clone(), context.clone(), ids.clone()
    lat[:, :, j + 1 :] += torch.randn(lat[:, :, j + 1 :].shape, generator=g)
    ctx[:, j + 1 :] += torch.randn(ctx[:, j + 1 :].shape, generator=g)
    sid[:, cell_frame_slice(j + 1).start :] = random_ids(sid.shape[1] - cell_frame_slice(j + 1).start, seed)[
        0
    ]
    return lat, ctx, sid


def test_block_causal_invariance(tiny_model):
    n = 6
    latents, context, ids = make_inputs(n, seed=11)
    t = torch.tensor([[0.0, 900.0, 700.0, 500.0, 300.0, 100.0]])
    with torch.no_grad():
        base = tiny_model(latents, t, context, ids, causal=FULL_CAUSAL)
        for j in range(n - 1):
            lat, ctx, sid = _perturb_after(latents, context, ids, j)
            t2 = t.clone()
            t2[:, j + 1 :] = 123.0
            out = tiny_model(lat, t2, ctx, sid, causal=FULL_CAUSAL)
            assert torch.equal(out[:, :, : j + 1], base[:, :, : j + 1]), f"cells <= {j} moved"
            assert not torch.allclose(out[:, :, j + 1], base[:, :, j + 1])
        bidir = tiny_model(latents, t, context, ids)
    assert not torch.allclose(bidir[:, :, 0], base[:, :, 0])  # the bidirectional model does look ahead


def test_teacher_forcing_invariance(tiny_model):
    n = 5
    clean, context, ids = make_inputs(n, seed=12)
    noisy = torch.randn_like(clean)
    t = torch.tensor([[0.0, 800.0, 600.0, 400.0, 200.0]])
    with torch.no_grad():
        base = tiny_model.forward_teacher_forcing(clean, noisy, t, context, ids)
        i = 2
        clean2, noisy2 = clean.clone(), noisy.clone()
        clean2[:, :, i:] += 1.0  # clean cells >= i
        noisy2[:, :, [0, 1, 3, 4]] += 1.0  # noisy cells != i
        out = tiny_model.forward_teacher_forcing(clean2, noisy2, t, context, ids)
    assert torch.equal(out[:, :, i], base[:, :, i])


def test_sink_and_window_exclusion(tiny_model_1layer):
    """One layer: the receptive field is exactly the mask (deeper nets reach further through
    intermediate cells, which is what the KV rollout reproduces too)."""
    n, q = 8, 7  # SMALL_WINDOW: cell 7 sees the sink cell 0 and cells 5..7
    latents, context, ids = make_inputs(n, seed=13)
    t = torch.full((1, n), 500.0)
    with torch.no_grad():
        base = tiny_model_1layer(latents, t, context, ids, causal=SMALL_WINDOW)
        for cell in range(n):
            lat = latents.clone()
            lat[:, :, cell] += 1.0
            out = tiny_model_1layer(lat, t, context, ids, causal=SMALL_WINDOW)
            same = torch.equal(out[:, :, q], base[:, :, q])
            assert same == (cell not in (0, 5, 6, 7)), f"cell {cell}"


@pytest.mark.parametrize("options", [{}, {"USE_TMA": True}], ids=["default", "kernel_options"])
def test_flex_backend_matches_sdpa(tiny_model, options):
    """Flex equals SDPA; kernel options are CUDA-kernel settings, left out on the CPU."""
    n = 4
    clean, context, ids = make_inputs(n, seed=14)
    noisy = torch.randn_like(clean)
    with torch.no_grad():
        ref = tiny_model.forward_teacher_forcing(clean, noisy, 600.0, context, ids, causal=SMALL_WINDOW)
        tiny_model.attn_backend, tiny_model.flex_options = "flex", options
        try:
            got = tiny_model.forward_teacher_forcing(clean, noisy, 600.0, context, ids, causal=SMALL_WINDOW)
        finally:
            tiny_model.attn_backend, tiny_model.flex_options = "sdpa", {}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ TF == cache


@pytest.mark.parametrize("per_cell_time", [False, True], ids=["per_token", "per_cell"])
@pytest.mark.parametrize("spec", [FULL_CAUSAL, SMALL_WINDOW], ids=["full", "window"])
def test_teacher_forcing_equals_kv_cache(tiny_model, spec, per_cell_time):
    if per_cell_time:  # t_mod per cell: [B, 2N, 6, dim] in teacher forcing, [B, 1, 6, dim] per KV cell
        tiny_model = make_model(seed=0, per_cell_time=True)
    n = 6
    clean, context, ids = make_inputs(n, seed=15)
    noisy = torch.randn_like(clean)
    noisy[:, :, 0] = clean[:, :, 0]
    t = torch.tensor([[0.0, 950.0, 800.0, 600.0, 350.0, 120.0]])
    with torch.no_grad():
        tf, clean_out = tiny_model.forward_teacher_forcing(
            clean, noisy, t, context, ids, causal=spec, return_clean=True
        )
        # the clean branch is a plain causal forward of the clean clip at t=0
        plain = tiny_model(clean, torch.zeros(1, n), context, ids, causal=spec)
        torch.testing.assert_close(clean_out, plain, rtol=1e-5, atol=1e-5)
        for i in range(1, n):
            out = kv_cell_output(tiny_model, clean, noisy, t, context, ids, spec, i)
            torch.testing.assert_close(out, tf[:, :, i : i + 1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ rollout


def _rollout(model, n, spec, seed, per_cell_text=True):
    latents, context, ids = make_inputs(n, seed=seed, per_cell_text=per_cell_text)
    record: list[dict] = []
    with torch.no_grad():
        out = kv_rollout(
            model,
            latents[:, :, :1],
            n,
            AXIS,
            spec=spec,
            context=context,
            sem_ids=ids,
            generator=torch.Generator().manual_seed(seed),
            record=record,
        )
    return out, context, ids, record


@pytest.mark.parametrize(("spec", "n"), [(SMALL_WINDOW, 8), (DEPLOY_CAUSAL, 21)], ids=["window", "deploy"])
def test_kv_rollout_equals_full_causal_forward(tiny_model, spec, n):
    out, context, ids, record = _rollout(tiny_model, n, spec, seed=16)
    assert out.shape == (1, 48, n, *LATENT_HW)
    assert len(record) == (n - 1) * (len(AXIS) + 1)  # 4 denoise forwards + 1 commit per cell
    commits = {r["cell"]: r for r in record if r["step"] == "commit"}
    last = {r["cell"]: r for r in record if r["step"] == len(AXIS) - 1}
    with torch.no_grad():
        # commit forwards == one causal forward over the committed clip at t=0
        full = tiny_model(out, torch.zeros(1, n), context, ids, causal=spec)
        for cell in range(1, n):
            assert torch.equal(commits[cell]["x"], out[:, :, cell : cell + 1])
            torch.testing.assert_close(commits[cell]["v"], full[:, :, cell : cell + 1], rtol=1e-5, atol=1e-5)
        # last denoise step of every cell == teacher forcing with the committed cells as clean context
        noisy = out.clone()
        t = torch.zeros(1, n)
        for cell in range(1, n):
            noisy[:, :, cell : cell + 1] = last[cell]["x"]
            t[0, cell] = last[cell]["t"]
        tf = tiny_model.forward_teacher_forcing(out, noisy, t, context, ids, causal=spec)
        for cell in range(1, n):
            torch.testing.assert_close(last[cell]["v"], tf[:, :, cell : cell + 1], rtol=1e-5, atol=1e-5)


def test_capped_rope_rollout_at_cell_25(tiny_model_1layer):
    """Cell 25 (beyond the cap) equals a fresh forward over [sink 0..2; window 9..24; cell 25] at
    RoPE positions [0, 1, 2, 4..19, 20] (one layer: cached K/V depend only on each cell's input)."""
    n, q = 26, 25
    model = tiny_model_1layer
    out, context, ids, record = _rollout(model, n, DEPLOY_CAUSAL, seed=17, per_cell_text=False)
    step = next(r for r in record if r["cell"] == q and r["step"] == len(AXIS) - 1)
    cells = [0, 1, 2, *range(9, q)]
    positions = torch.tensor(
        [
            *rope_time_positions(torch.tensor(cells), q, DEPLOY_CAUSAL).tolist(),
            query_time_position(q, DEPLOY_CAUSAL),
        ]
    )
    assert positions.tolist() == [0, 1, 2, *range(4, 21)]
    seq = torch.cat([out[:, :, cells], step["x"]], dim=2)
    seq_ids = torch.cat([ids[:, cell_frame_slice(c)] for c in [*cells, q]], dim=1)
    t = torch.zeros(1, len(cells) + 1)
    t[0, -1] = step["t"]
    with torch.no_grad():
        fresh = model(seq, t, context, seq_ids, causal=FULL_CAUSAL, cell_positions=positions)
    torch.testing.assert_close(step["v"], fresh[:, :, -1:], rtol=1e-5, atol=1e-5)
    # without the cap the positions would run to 25 and the output would differ
    with torch.no_grad():
        uncapped = model(
            seq, t, context, seq_ids, causal=FULL_CAUSAL, cell_positions=torch.tensor([*cells, q])
        )
    assert not torch.allclose(step["v"], uncapped[:, :, -1:], atol=1e-4)


def test_full_sequence_beyond_cap_is_refused(tiny_model):
    latents, context, ids = make_inputs(22, seed=18, per_cell_text=False)
    with pytest.raises(ValueError, match="rope_cap"), torch.no_grad():
        tiny_model(latents, 500.0, context, ids, causal=DEPLOY_CAUSAL)


def test_cache_holds_committed_clean_kv_only(tiny_model):
    """After rollout the cache holds sink + window cells, each equal to the K/V of a fresh causal
    forward of the committed clip at t=0 (no noisy-step K/V remain)."""
    n = 8
    latents, context, ids = make_inputs(n, seed=19)
    text = tiny_model.per_cell_text(context, None, n)
    cache = tiny_model.new_kv_cache(SMALL_WINDOW, LATENT_HW)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        tiny_model.forward_kv(latents[:, :, :1], 0, 0.0, text(0), ids[:, :1], cache, commit=True)
        cells = [latents[:, :, :1]]
        for c in range(1, n):
            x_init = torch.randn(latents[:, :, :1].shape, generator=gen)
            cells.append(
                denoise_cell(
                    tiny_model,
                    cache,
                    c,
                    x_init,
                    AXIS,
                    text=text(c),
                    sem_ids=ids[:, cell_frame_slice(c)],
                    generator=gen,
                )
            )
    assert cache.cells == [0, 6, 7]  # sink 0 + window for the next cell 8: cells 6..7
    assert all(len(ks) == 3 and all(k.shape[1] == 6 for k in ks) for ks in cache.k)  # per cell
    clip = torch.cat(cells, dim=2)

    captured: dict[int, torch.Tensor] = {}
    orig = tiny_model._full_attention

    def capture(*args, **kwargs):
        plan = orig(*args, **kwargs)
        inner = plan.__call__

        class Spy:
            def __call__(self, layer, q, k, v):
                captured[layer] = torch.cat([k, v], dim=-1)
                return inner(layer, q, k, v)

        return Spy()

    tiny_model._full_attention = capture
    try:
        with torch.no_grad():
            tiny_model(clip, torch.zeros(1, n), context, ids, causal=SMALL_WINDOW)
    finally:
        del tiny_model._full_attention
    tok = 6
    for layer in range(len(tiny_model.blocks)):
        want = torch.cat([captured[layer][:, c * tok : (c + 1) * tok] for c in cache.cells], dim=1)
        torch.testing.assert_close(torch.cat(cache.layer_kv(layer), dim=-1), want, rtol=1e-5, atol=1e-5)


def test_rollout_deterministic_and_exit_step_gradients(tiny_model):
    a, *_ = _rollout(tiny_model, 4, DEPLOY_CAUSAL, seed=20)
    b, *_ = _rollout(tiny_model, 4, DEPLOY_CAUSAL, seed=20)
    assert torch.equal(a, b)
    # DMD-style exit step with grad: only that forward holds a graph; the cache stays detached
    latents, context, ids = make_inputs(3, seed=21, per_cell_text=False)
    text = TextContext.build(context)
    cache = tiny_model.new_kv_cache(DEPLOY_CAUSAL, LATENT_HW)
    with torch.no_grad():
        tiny_model.forward_kv(latents[:, :, :1], 0, 0.0, text, ids[:, :1], cache, commit=True)
    x0 = denoise_cell(
        tiny_model,
        cache,
        1,
        torch.randn(1, 48, 1, *LATENT_HW),
        AXIS,
        text=text,
        sem_ids=ids[:, cell_frame_slice(1)],
        generator=torch.Generator().manual_seed(1),
        exit_step=1,
        grad=True,
    )
    assert x0.requires_grad
    assert not any(k.requires_grad for ks in cache.k for k in ks) and cache.cells == [0, 1]
    x0.pow(2).mean().backward()
    try:
        assert tiny_model.blocks[0].self_attn.q.weight.grad.abs().sum() > 0
        assert tiny_model.gc_sem_cond.proj_out.weight.grad.abs().sum() > 0
    finally:
        tiny_model.zero_grad(set_to_none=True)


class _ShardedLike(torch.nn.Module):
    """Stands in for an FSDP/DeepSpeed wrapper: weights may only be used inside its forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.inside = False
        self.calls = 0
        self._hooks = [m.register_forward_pre_hook(self._check) for m in inner.modules() if m is not inner]

    def _check(self, module, args):
        assert self.inside, f"{type(module).__name__} ran outside the wrapper's forward"

    def forward(self, *args, **kwargs):
        self.inside, self.calls = True, self.calls + 1
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.inside = False

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


def test_rollout_uses_weights_only_inside_the_wrapper_forward(tiny_model):
    n = 4
    latents, context, ids = make_inputs(n, seed=22)

    def rollout(model):
        return kv_rollout(
            model,
            latents[:, :, :1],
            n,
            AXIS,
            spec=DEPLOY_CAUSAL,
            context=context,
            sem_ids=ids,
            generator=torch.Generator().manual_seed(3),
        )

    with torch.no_grad():
        b = rollout(tiny_model)
    wrapped = _ShardedLike(tiny_model)
    try:
        with torch.no_grad():
            a = rollout(wrapped)
            tf = wrapped(latents, 500.0, context, ids, mode="tf", clean=latents)
    finally:
        for h in wrapped._hooks:
            h.remove()
    assert torch.equal(a, b)
    assert wrapped.calls == 1 + (n - 1) * (len(AXIS) + 1) + 1  # prefill + 5 per cell + the tf call
    assert tf.shape == latents.shape
    with pytest.raises(ValueError, match="mode="):
        tiny_model(latents, 500.0, context, ids, mode="bogus")
    with pytest.raises(ValueError, match="needs clean="):
        tiny_model(latents, 500.0, context, ids, mode="tf")
