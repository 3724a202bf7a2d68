"""Stage 3 (DMD with self-rollout) on tiny models (research/distill_anchors.md §9): the DMD gradient
and its float64 surrogate, the critic's flow loss, a toy 2-D Gaussian with analytic scores, which
forwards hold graph nodes in the rollout, the frankenstein tail, which networks get gradients, and
the rollout = the deploy rollout with the exit step forced to the last and no grad."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.report import StdoutReporter
from gc25d_core.train.presets import stage_config
from gc25d_core.train.stage3_dmd import Stage3Run, critic_flow_loss, dmd_generator_loss, dmd_gradient
from tests.train.world import stage3_world


def _mask(cells: int) -> torch.Tensor:
    m = torch.ones(1, 1, cells, 1, 1, dtype=torch.bool)
    m[:, :, 0] = False
    return m


# ---------------------------------------------------------------------------- the math


def test_real_equal_to_fake_gives_a_zero_generator_gradient():
    x = torch.randn(2, 4, 5, 3, 3, requires_grad=True)
    score = torch.randn(2, 4, 5, 3, 3)
    mask = _mask(5)
    grad = dmd_gradient(x.detach(), score, score, mask)
    assert torch.equal(grad, torch.zeros_like(grad))
    dmd_generator_loss(x, grad, mask).backward()
    assert x.grad is not None and torch.equal(x.grad, torch.zeros_like(x))


def test_autograd_on_the_surrogate_is_grad_over_numel_on_the_unmasked_elements():
    x = torch.randn(2, 4, 5, 3, 3, requires_grad=True)
    fake, real = torch.randn(2, 4, 5, 3, 3), torch.randn(2, 4, 5, 3, 3)
    mask = _mask(5)
    grad = dmd_gradient(x.detach(), fake, real, mask)
    dmd_generator_loss(x, grad, mask).backward()
    numel = int(mask.expand_as(x).sum())
    expected = (grad / numel) * mask
    torch.testing.assert_close(x.grad, expected.float(), rtol=1e-6, atol=1e-9)
    assert torch.equal(x.grad[:, :, 0], torch.zeros_like(x.grad[:, :, 0]))  # the anchor gets nothing


def test_the_normaliser_is_per_clip_and_nan_input_gives_a_finite_gradient():
    x = torch.randn(2, 4, 5, 3, 3)
    real = x + torch.tensor([1.0, 3.0]).view(2, 1, 1, 1, 1)  # mean |x − x̂_real| = 1 and 3
    fake = real + 1.0
    grad = dmd_gradient(x, fake, real, _mask(5))
    assert torch.allclose(grad[0, :, 1:], torch.full_like(grad[0, :, 1:], 1.0))
    assert torch.allclose(grad[1, :, 1:], torch.full_like(grad[1, :, 1:], 1 / 3))
    x_nan = x.clone()
    x_nan[0, 0, 2, 0, 0] = float("nan")
    bad = dmd_gradient(x_nan, fake, real, _mask(5))
    assert torch.isfinite(bad).all()


def test_the_critic_loss_is_flow_matching_on_the_unmasked_cells():
    x, noise = torch.randn(1, 4, 5, 2, 2), torch.randn(1, 4, 5, 2, 2)
    v = noise - x
    assert float(critic_flow_loss(v, noise, x, _mask(5))) == 0.0
    v[:, :, 0] += 10.0  # the anchor is out of the loss
    assert float(critic_flow_loss(v, noise, x, _mask(5))) == 0.0
    v[:, :, 3] += 1.0
    assert float(critic_flow_loss(v, noise, x, _mask(5))) == pytest.approx(1 / 4)


def test_toy_2d_gaussian_dmd_moves_the_generator_toward_the_target():
    """Generator x = A z + b, z ~ N(0, I); real score = the posterior mean E[x0 | x_t] of the target
    N(mu, S); fake score = the same for the generator's current N(b, A Aᵀ) (a critic that tracks it
    exactly). 300 steps of the DMD surrogate with Adam move mean and covariance to the target."""
    torch.manual_seed(0)
    mu, cov = torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 0.6], [0.6, 0.8]])
    a = torch.nn.Parameter(torch.eye(2) * 0.3)
    b = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([a, b], lr=2e-2)

    def posterior_mean(x_t: torch.Tensor, sigma: float, m: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        k = c * (1 - sigma) @ torch.linalg.inv((1 - sigma) ** 2 * c + sigma**2 * torch.eye(2))
        return m + (x_t - (1 - sigma) * m) @ k.T

    def distance() -> float:
        c = a.detach() @ a.detach().T
        return float((b.detach() - mu).norm() + (c - cov).norm())

    start = distance()
    for _ in range(300):
        x = torch.randn(256, 2) @ a.T + b
        sigma = float(torch.rand(()) * 0.96 + 0.02)
        x_t = (1 - sigma) * x.detach() + sigma * torch.randn(256, 2)
        fake = posterior_mean(x_t, sigma, b.detach(), a.detach() @ a.detach().T)
        real = posterior_mean(x_t, sigma, mu, cov)
        mask = torch.ones(256, 2, dtype=torch.bool)
        grad = dmd_gradient(x.detach(), fake, real, mask)
        opt.zero_grad()
        dmd_generator_loss(x, grad, mask).backward()
        opt.step()
    assert distance() < 0.25 * start, (start, distance())


# ---------------------------------------------------------------------------- the rollout and the run


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stage3")
    cfg = stage3_world(root, {"engine": "torch", "max_steps": 2, "export_every": 2, "state_every": 2})
    run = Stage3Run(cfg, stage_config(cfg, "stage3_dmd"), root / "run", StdoutReporter(rank=0))
    run._prepare_run_dir()
    run.build(run._resume())
    return run


def _samples(run: Stage3Run):
    return [s for _, s in run.data.next_micro()]


@pytest.mark.parametrize("path", ["module", "fast_per_cell", "fast"])
def test_only_exit_forwards_of_the_last_k_cells_hold_graph_nodes(built, path):
    """Module path: every forward on the training module, only the K exit forwards with grad. Fast
    path per cell: the training module runs exactly those K grad forwards, the replica all the
    others. Fast path (batched exits, the default): the training module runs one grad forward, over
    the K scored cells at once."""
    run, cells, exit_step = built, 23, 2
    calls: list[tuple[int, bool]] = []
    forward = run.model

    class Counting:
        module = run.model.module
        scheduler = run.model.scheduler

        def __call__(self, *args, **kwargs):
            grad = torch.is_grad_enabled() and not kwargs.get("commit", False)
            if kwargs.get("mode") == "kv_cells":
                calls.extend((s.cell, grad) for s in kwargs["cache"].snapshots)
            else:
                calls.append((kwargs.get("cell", -1), grad))
            return forward(*args, **kwargs)

    run.model = Counting()  # type: ignore[assignment]
    run.rollout_path = "module" if path == "module" else "fast"
    section = run.section
    run.section = section.model_copy(update={"batch_exit_forwards": path == "fast"})
    try:
        x, _, _ = run.rollout(_samples(run), cells, exit_step, torch.Generator().manual_seed(0), grad=True)
    finally:
        run.model = forward
        run.rollout_path = "fast"
        run.section = section
    horizon = run.section.grad_horizon
    with_grad = [c for c, g in calls if g]
    assert with_grad == list(range(cells - horizon, cells))  # one exit forward per scored cell
    # per generated cell: exit_step + 1 denoise forwards and a commit; the anchor's prefill
    assert len(calls) == (1 + (cells - 1) * (exit_step + 2) if path == "module" else horizon)
    assert x.shape[2] == 1 + horizon and x.requires_grad
    params = [p for p in run.model.module.parameters() if p.requires_grad]
    anchor_grads = torch.autograd.grad(x[:, :, 0].sum(), params, allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in anchor_grads)  # the anchor carries no gradient


def test_the_scored_clip_starts_with_the_real_anchor(built):
    run = built
    samples = _samples(run)
    with torch.no_grad():
        x, ids, keys = run.rollout(samples, 21, 3, torch.Generator().manual_seed(1), grad=False)
    assert torch.equal(x[:, :, 0], samples[0].latent[None, :, 0].float())
    assert ids.shape[1] == 1 + 4 * run.section.grad_horizon and len(keys[0]) == 1 + run.section.grad_horizon
    _, _, mask, _ = run._noised(x, torch.Generator().manual_seed(2))
    assert not bool(mask[0, 0, 0]) and bool(mask[0, 0, 1:].all())


def test_the_real_score_guided_over_the_ids_is_uncond_plus_g_times_their_difference(built, monkeypatch):
    """``real_guidance`` 1.0 (SPEC §8's cfg 1.0) is the one conditional pass; g > 1 runs cond and
    uncond (every id UNKNOWN) as one batch and steps g times their difference from uncond."""
    from gc25d_core.vocab import UNKNOWN

    run = built
    with torch.no_grad():
        x, ids, keys = run.rollout(_samples(run), 21, 3, torch.Generator().manual_seed(1), grad=False)
    x_t, _, _, t = run._noised(x, torch.Generator().manual_seed(2))
    real = run.real
    proj = real.gc_sem_cond.proj_out.weight
    saved = proj.detach().clone()
    batches: list[int] = []

    def counted(**kwargs):
        batches.append(kwargs["latents"].shape[0])
        return real(**kwargs)

    try:
        with torch.no_grad():
            proj.normal_(std=0.05, generator=torch.Generator().manual_seed(3))  # a fresh encoder adds 0
            cond = run._score(real, x_t, t, keys, ids)
            uncond = run._score(real, x_t, t, keys, torch.full_like(ids, UNKNOWN))
            assert float((cond - uncond).abs().max()) > 1e-4  # the ids move this real score
            monkeypatch.setattr(run, "real", counted)
            monkeypatch.setattr(run, "section", run.section.model_copy(update={"real_guidance": 1.0}))
            assert torch.equal(run.real_x0(x_t, t, keys, ids), cond) and batches == [x.shape[0]]
            monkeypatch.setattr(run, "section", run.section.model_copy(update={"real_guidance": 3.0}))
            guided = run.real_x0(x_t, t, keys, ids)
        assert batches[1:] == [2 * x.shape[0]]  # both passes in one forward
        torch.testing.assert_close(guided, uncond + 3.0 * (cond - uncond), rtol=1e-5, atol=1e-5)
    finally:
        with torch.no_grad():
            proj.copy_(saved)


def test_the_rollout_equals_the_deploy_rollout_with_the_last_exit_step(built):
    """exit step = the last, no grad: the stage's rollout is kv_rollout, the deploy path."""
    from gc25d_core.models.sampler import kv_rollout
    from gc25d_core.train.inputs import to_device

    run, cells = built, 24
    samples = _samples(run)
    seed_gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        x, _, _ = run.rollout(samples, cells, len(run.axis) - 1, seed_gen, grad=False)
        s = samples[0]
        bank, index = run.text.context([s.all_keys()[:cells]])
        device_seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
        ref = kv_rollout(
            run.model.module,
            to_device(s.latent[None], run.device).float()[:, :, :1],
            cells,
            run.axis,
            spec=run.rollout_causal,
            context=bank,
            context_index=index,
            sem_ids=s.all_ids()[None, : 1 + 4 * (cells - 1)],
            generator=torch.Generator().manual_seed(device_seed),
        )
    tail = torch.cat([ref[:, :, :1], ref[:, :, cells - run.section.grad_horizon :]], dim=2)
    assert torch.equal(x, tail)


def test_each_network_gets_gradients_only_in_its_own_step(built):
    """One training step through the loop's phases: at each optimizer step only that phase's
    network holds gradients; the critic's updates come first, then the generator's."""
    run = built
    seen: list[str] = []

    def grads(params) -> bool:
        return any(p.grad is not None for p in params)

    def checked(name: str, trained, others):
        step = trained.step

        def wrapper(boundary: bool):
            assert grads(trained.module.parameters()), name  # its own backward reached it
            for other in others:
                assert not grads(other.parameters()), name  # no other network got gradients
            seen.append(name)
            return step(boundary)

        return wrapper

    run.critic.step = checked("critic", run.critic, [run.model.module, run.real])  # type: ignore[method-assign]
    run.model.step = checked("generator", run.model, [run.critic.module, run.real])  # type: ignore[method-assign]
    try:
        record = run.train_step(1)
    finally:
        del run.critic.step, run.model.step
    assert seen == ["critic"] * run.section.critic_steps + ["generator"]
    assert all(not p.requires_grad and p.grad is None for p in run.real.parameters())
    assert record["critic_loss"] > 0 and record["gen_loss"] == record["loss"]
    assert run.ema.updates == 0 and not run.ema.started  # the EMA starts at step 3


def test_recomputed_exit_forwards_give_the_same_gradients_without_holding_the_cached_cells(built):
    """model.gradient_checkpointing in the rollout: the K exit forwards recompute their blocks in
    backward over a record of the cells they saw (``KVStepAttention(replayable=True)``), after
    later commits and evictions changed the cache. Same scored clip, same generator gradients; the
    graph no longer holds each exit forward's concatenated K/V of the cached cells."""
    from gc25d_core.models.causal import visible

    run, cells, exit_step = built, 24, 1
    samples = _samples(run)
    params = [p for p in run.model.module.parameters() if p.requires_grad]
    weight = None
    results = []
    for checkpoint in (False, True):
        run.rollout_checkpoint = checkpoint
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor, storages: dict[int, int] = storages) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                x, _, _ = run.rollout(samples, cells, exit_step, torch.Generator().manual_seed(3), grad=True)
        finally:
            run.rollout_checkpoint = False
        if weight is None:
            weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
        grads = torch.autograd.grad((x * weight).sum(), params)
        results.append((x.detach(), grads, sum(storages.values())))
    (x_plain, g_plain, saved_plain), (x_ckpt, g_ckpt, saved_ckpt) = results
    assert torch.equal(x_ckpt, x_plain)
    for a, b in zip(g_ckpt, g_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    # what the plain graph holds beyond the recomputed one: at least every exit forward's K and V
    # of the cells it attended (cache + itself), per layer, in fp32
    model = run.model.module
    first = cells - run.section.grad_horizon
    seen = [int(visible(q, torch.arange(q), run.rollout_causal).sum()) + 1 for q in range(first, cells)]
    tpc = x.shape[-2] // 2 * (x.shape[-1] // 2)
    kv_bytes = sum(seen) * tpc * model.dim * 2 * 4 * len(model.blocks)
    assert saved_plain - saved_ckpt >= kv_bytes, (saved_plain, saved_ckpt, kv_bytes)


@pytest.mark.parametrize("batched", [False, True], ids=["per_cell_exits", "batched_exits"])
def test_the_fast_rollout_equals_the_module_rollout_with_its_gradients(built, batched):
    """rollout_path "fast" (the replica, eager on a CPU) against "module" (every forward on the
    training module): the same scored clip and the same generator gradients — bit for bit with the
    exit forwards per cell; with them batched into one forward over the K cells (the default),
    within fp32 rounding of other matrix shapes (the clip and the gradients within 1e-5 of their
    largest values)."""
    run, cells, exit_step = built, 23, 1
    samples = _samples(run)
    params = [p for p in run.model.module.parameters() if p.requires_grad]
    results = []
    section = run.section
    run.section = section.model_copy(update={"batch_exit_forwards": batched})
    try:
        for path in ("module", "fast"):
            run.rollout_path = path
            x, _, _ = run.rollout(samples, cells, exit_step, torch.Generator().manual_seed(3), grad=True)
            weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
            results.append((x.detach(), torch.autograd.grad((x * weight).sum(), params)))
    finally:
        run.rollout_path = "fast"
        run.section = section
    (x_module, g_module), (x_fast, g_fast) = results
    if not batched:
        assert torch.equal(x_fast, x_module)
        assert all(torch.equal(a, b) for a, b in zip(g_fast, g_module, strict=True))
        return

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    # other GEMM shapes: equal where the kernels round alike at every shape (MKL strict), else close
    assert rel(x_fast, x_module) < 1e-5
    # against the largest gradient: some (a key bias's: softmax ignores it) are rounding noise alone
    top = max(float(b.abs().max()) for b in g_module)
    assert max(float((a - b).abs().max()) for a, b in zip(g_fast, g_module, strict=True)) < 1e-5 * top


def test_the_replica_is_gathered_once_per_generator_update_and_never_saved(built):
    """The step's critic_steps + 1 rollouts share one gather (the generator changes only at its own
    optimizer step); after the update the next rollout gathers the new weights. The replica is
    derived state: no part of the run's saved state."""
    run = built
    runner = run._fast()
    loads: list[int] = []
    load = runner.load

    def counting(named, version=None):
        loads.append(version)
        return load(named, version)

    runner.load = counting  # type: ignore[method-assign]
    try:
        before = run.model.scheduler.last_epoch
        run.train_step(2)  # the replica holds the current weights: the step's rollouts gather none
        assert loads == [] and run.model.scheduler.last_epoch == before + 1
        run.train_step(3)  # the generator moved at the end of step 2: one gather, at the first rollout
        assert loads == [before + 1] and run.model.scheduler.last_epoch == before + 2
        run._fast()
        assert loads == [before + 1, before + 2]
    finally:
        del runner.load
    own = dict(runner.model.named_parameters())
    for name, p in run.model.module.named_parameters():
        assert torch.equal(own[name], p.detach()), name
    assert "fast_runner" not in run.state_parts() and not any(
        part is runner for part in run.state_parts().values()
    )


@pytest.mark.parametrize("path", ["module", "fast"])
def test_the_critic_updates_rollouts_in_one_batch_are_the_one_by_one_rollouts(built, path):
    """``rollout_groups``: three critic updates' rollouts (their own samples, draws and generators)
    as one batch give each update's clip, ids and keys as its own rollout does (the clips up to
    fp32 rounding: the rows' GEMMs run at another batch size), and leave each generator where its
    own rollout leaves it (the update's noise draws after the rollout are the same)."""
    run = built
    run.rollout_path = path
    groups = [_samples(run) for _ in range(3)]
    draws = [(23, 1), (21, 3), (26, 0)]
    try:
        with torch.no_grad():
            gens = [torch.Generator().manual_seed(10 + k) for k in range(3)]
            alone = [
                run.rollout(g, c, e, gen, grad=False)
                for g, (c, e), gen in zip(groups, draws, gens, strict=True)
            ]
            gens_b = [torch.Generator().manual_seed(10 + k) for k in range(3)]
            batched = run.rollout_groups(groups, draws, gens_b, grad=False)
    finally:
        run.rollout_path = "fast"
    for (x, ids, keys), (xb, ids_b, keys_b) in zip(alone, batched, strict=True):
        torch.testing.assert_close(xb, x, rtol=0, atol=1e-5)
        assert torch.equal(ids_b, ids) and keys_b == keys
    assert [int(torch.randint(0, 2**30, (1,), generator=g)) for g in gens_b] == [
        int(torch.randint(0, 2**30, (1,), generator=g)) for g in gens
    ]
    with pytest.raises(ValueError, match="one with grad, or several of one size"):
        run.rollout_groups(groups[:2], draws[:2], gens[:2], grad=True)


def test_a_step_with_the_critic_rollouts_batched_is_the_step_one_by_one(tmp_path):
    """``batch_critic_rollouts``: the loop hands the critic phase's micro-batches to the stage up
    front (``Phase.prefetch``) and each update then gets its clip; the step's draws, data and
    records are the one-by-one step's (the losses up to fp32 rounding)."""
    torch.set_num_threads(1)
    records, draws, cursors = [], [], []
    for batch in (False, True):
        root = tmp_path / str(batch)
        settings = {"engine": "torch", "max_steps": 2, "critic_steps": 3, "batch_critic_rollouts": batch}
        cfg = stage3_world(root, settings)
        run = Stage3Run(cfg, stage_config(cfg, "stage3_dmd"), root / "run", StdoutReporter(rank=0))
        run._prepare_run_dir()
        run.build(run._resume())
        assert (run.phases()[0].prefetch is not None) == batch
        records.append([run.train_step(step) for step in (1, 2)])
        draws.append(list(run.draws))
        cursors.append({k: v for k, v in run.data.state().items() if k != "manifest"})  # own world
        assert run.critic_clips == {}  # every prefetched clip was taken by its update
    assert draws[0] == draws[1] and cursors[0] == cursors[1]
    for one, batched in zip(*records, strict=True):
        for key in ("critic_loss", "gen_loss", "grad_norm", "t_mean"):
            assert batched[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
