"""The rollout fast path (models.fast_rollout): the causal sampler run on a replica of the generator
against a batch static KV cache (CUDA graphs on a GPU) gives the rollout of the training module
through the dynamic KVCache, bit for bit: no-grad, and with the exit forwards of the last cells
carrying gradients on the training module (recomputed in backward) against the mirror of the static
cache. On a CPU the replica runs eagerly; the ``gpu`` test replays the graphs."""

from __future__ import annotations

import copy

import pytest
import torch

from gc25d_core.models.configs import CausalConfig
from gc25d_core.models.fast_rollout import ExitCapture, ReplicaMode, RolloutRunner
from gc25d_core.models.gcdit import TextContext
from gc25d_core.models.sampler import CausalStreamer, RowGroups
from gc25d_core.models.sem_cond import cell_frame_slice, cells_frame_slice

from .tiny import make_inputs, make_model

# a window of 3 with one sink and a RoPE cap of 5 over 9 cells: every fill level, eviction, the cap
SPEC = CausalConfig(sink=1, window=3, rope_cap=5)
AXIS = (1000.0, 750.0, 500.0, 250.0)
CELLS, HORIZON = 9, 4


# tests/conftest.py's: bit-for-bit comparisons on one CPU thread
pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(batch: int, distinct: bool, device: str = "cpu"):
    latents, context, ids = make_inputs(CELLS, seed=7, batch=batch)
    anchor = latents[:, :, :1].to(device)
    if distinct:  # a bank of the batch's prompts per cell (text.TextTable.context: P = B)
        banks = [context[:, c][None].expand(batch, -1, -1, -1) for c in range(CELLS)]
        index = torch.arange(batch)[:, None]
    else:  # one prompt for the batch (P = 1 < B: the slot pads the bank)
        banks = [context[:1, c : c + 1].expand(batch, -1, -1, -1) for c in range(CELLS)]
        index = torch.zeros(batch, 1, dtype=torch.long)
    return anchor, [b.to(device) for b in banks], index, ids.to(device)


def _rollout(streamer, start, text, anchor, banks, index, ids, exit_step: int, grad: bool, seed: int):
    gen = torch.Generator(device=anchor.device).manual_seed(seed)
    with torch.no_grad():
        start(anchor, text(banks[0], index), ids[:, cell_frame_slice(0)])
    out = []
    for cell in range(1, CELLS):
        scored = cell >= CELLS - HORIZON
        x0 = streamer.step(
            text(banks[cell], index),
            ids[:, cell_frame_slice(cell)],
            generator=gen,
            exit_step=exit_step,
            grad=grad and scored,
        )
        out.append(x0.float())
    return torch.cat(out, dim=2)


def _module_rollout(model, forward, *args, exit_step: int, grad: bool, seed: int = 0):
    streamer = CausalStreamer(model, SPEC, AXIS, forward=forward, checkpoint=True)
    return _rollout(
        streamer, streamer.start, TextContext.build, *args, exit_step=exit_step, grad=grad, seed=seed
    )


def _fast_rollout(runner: RolloutRunner, slow, anchor, *args, exit_step: int, grad: bool, seed: int = 0):
    streamer = runner.streamer(SPEC, AXIS, anchor, slow=slow if grad else None, checkpoint=True)

    def start(*a):
        runner.start(streamer, *a)

    return _rollout(
        streamer, start, runner.cell_text, anchor, *args, exit_step=exit_step, grad=grad, seed=seed
    )


def _runner(model, mode: ReplicaMode, device: str) -> RolloutRunner:
    runner = RolloutRunner(model, mode, torch.device(device))
    runner.load(model.named_parameters(), version=0)
    return runner


@pytest.mark.parametrize("distinct", [True, False], ids=["bank_of_B", "one_prompt"])
def test_fast_no_grad_rollout_equals_the_module_rollout(distinct):
    torch.manual_seed(0)
    model = make_model(seed=1)
    runner = _runner(model, ReplicaMode(), "cpu")
    args = _inputs(batch=2, distinct=distinct)
    with torch.no_grad():
        for exit_step in (3, 1):  # the deploy rollout, and an early exit
            ref = _module_rollout(model, model, *args, exit_step=exit_step, grad=False, seed=exit_step)
            # twice on the same runner: the second rollout reuses the cache, the slot and its memo
            for _ in range(2):
                fast = _fast_rollout(runner, None, *args, exit_step=exit_step, grad=False, seed=exit_step)
                assert torch.equal(fast, ref)
    assert runner.cache is not None and runner.cache.k_raw[0] is not None
    assert runner.cache.k_raw[0].shape[0] == 2  # one static buffer for the batch


def test_fast_grad_rollout_equals_the_module_rollout_in_values_and_gradients():
    """The exit forwards of the last cells run on the training module, recomputed in backward,
    against the mirror of the replica's commits: the same clip and the same gradients."""
    model = make_model(seed=2).train()
    runner = _runner(model, ReplicaMode(), "cpu")
    args = _inputs(batch=2, distinct=True)
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for fast in (False, True):
        if fast:
            x = _fast_rollout(runner, model, *args, exit_step=2, grad=True)
        else:
            x = _module_rollout(model, model, *args, exit_step=2, grad=True)
        weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
        results.append((x.detach(), torch.autograd.grad((x * weight).sum(), params)))
    (x_ref, g_ref), (x_fast, g_fast) = results
    assert torch.equal(x_fast, x_ref)
    assert all(torch.equal(a, b) for a, b in zip(g_fast, g_ref, strict=True))
    assert any(g.abs().sum() > 0 for g in g_fast)


def _fast_rollout_batched_exits(
    runner: RolloutRunner, slow, anchor, banks, index, ids, exit_step: int, seed: int = 0
):
    """The whole rollout on the replica, then the last HORIZON cells' exit forwards with grad as
    one forward of ``slow`` over those cells (``ExitCapture``), put in place of the replica's x0."""
    exits = ExitCapture(range(CELLS - HORIZON, CELLS), AXIS[exit_step])
    streamer = runner.streamer(SPEC, AXIS, anchor, checkpoint=True, exits=exits)

    def start(*a):
        runner.start(streamer, *a)

    args = (anchor, banks, index, ids)
    x = _rollout(streamer, start, runner.cell_text, *args, exit_step=exit_step, grad=False, seed=seed)
    tail = exits.cells
    x0 = exits.forward(slow, _exit_text(banks, index, tail), ids[:, cells_frame_slice(tail)], checkpoint=True)
    return torch.cat([x[:, :, : tail[0] - 1], x0.float()], dim=2), exits


def _exit_text(banks, index, tail: range) -> TextContext:
    """The scored cells' prompts as one bank (each cell's P prompts in turn) and an index [B, K]."""
    bank = torch.cat([banks[c] for c in tail], dim=1)
    per_cell = banks[tail[0]].shape[1]
    return TextContext.build(bank, torch.cat([index + i * per_cell for i in range(len(tail))], dim=1))


@pytest.mark.parametrize("exit_step", [2, 0])
def test_batched_exit_forwards_equal_the_per_cell_grad_rollout(exit_step):
    """The K exit forwards with grad as one forward over the K cells, each attending to the snapshot
    of the cache its own forward saw: the clip and the gradients of the per-cell grad forwards,
    up to the rounding of other matrix shapes (fp32 here: within 1e-5 of the largest value)."""
    model = make_model(seed=2).train()
    runner = _runner(model, ReplicaMode(), "cpu")
    args = _inputs(batch=2, distinct=True)
    params = [p for p in model.parameters() if p.requires_grad]
    weight = None
    results = []
    for batched in (False, True):
        if batched:
            x, exits = _fast_rollout_batched_exits(runner, model, *args, exit_step=exit_step)
        else:
            x = _fast_rollout(runner, model, *args, exit_step=exit_step, grad=True)
        weight = (
            torch.randn(x.shape, generator=torch.Generator().manual_seed(4)) if weight is None else weight
        )
        results.append((x.detach(), torch.autograd.grad((x * weight).sum(), params, allow_unused=True)))
    (x_ref, g_ref), (x_new, g_new) = results
    assert x_new.shape == x_ref.shape
    assert _rel(x_new, x_ref) < 1e-5
    assert torch.equal(x_new[:, :, : CELLS - HORIZON - 1], x_ref[:, :, : CELLS - HORIZON - 1])
    used = [(a, b) for a, b in zip(g_new, g_ref, strict=True) if b is not None]
    assert len(used) == sum(b is not None for b in g_ref) and any(b.abs().sum() > 0 for _, b in used)
    assert max(_rel(a, b) for a, b in used if b.abs().max() > 0) < 1e-4
    # each scored cell's snapshot holds what it saw: the window's cells before it, by reference
    assert sorted(exits.snapshots) == list(range(CELLS - HORIZON, CELLS))
    assert all(s.cells and max(s.cells) == s.cell - 1 for s in exits.snapshots.values())


def test_an_exit_capture_refuses_a_rollout_that_did_not_reach_its_cells():
    model = make_model(seed=2)
    runner = _runner(model, ReplicaMode(), "cpu")
    anchor, banks, index, ids = _inputs(batch=1, distinct=True)
    exits = ExitCapture(range(CELLS - HORIZON, CELLS), AXIS[1])
    with pytest.raises(ValueError, match="either per cell"):
        runner.streamer(SPEC, AXIS, anchor, slow=model, exits=exits)
    streamer = runner.streamer(SPEC, AXIS, anchor, exits=exits)
    with torch.no_grad():
        runner.start(streamer, anchor, runner.cell_text(banks[0], index), ids[:, cell_frame_slice(0)])
        streamer.step(runner.cell_text(banks[1], index), ids[:, cell_frame_slice(1)], exit_step=1)
    with pytest.raises(RuntimeError, match="did not reach the exits of cells"):
        exits.forward(model, TextContext.build(banks[1], index), ids[:, cell_frame_slice(1)])


def _grouped_rollout(streamer, start, text, anchor, banks, index, ids, groups: RowGroups):
    with torch.no_grad():
        start(anchor, text(banks[0], index), ids[:, cell_frame_slice(0)])
        out = [
            streamer.step(text(banks[c], index), ids[:, cell_frame_slice(c)], groups=groups).float()
            for c in range(1, CELLS)
        ]
    return torch.cat(out, dim=2)


def _rows(args, rows: slice):
    anchor, banks, index, ids = args
    return anchor[rows], [b[rows] for b in banks], index[rows], ids[rows]


@pytest.mark.parametrize("per_group", [1, 2])
def test_row_groups_roll_out_each_group_as_it_would_alone(per_group):
    """Three rollouts in one batch (stage 3's critic updates of a step), each with its own
    generator and exit step: every group's cells are its rollout alone, on the module and on the
    fast path."""
    torch.manual_seed(0)
    model = make_model(seed=3)
    exits, seeds = (3, 1, 2), (10, 11, 12)
    args = _inputs(batch=3 * per_group, distinct=True)
    alone = []
    with torch.no_grad():
        for g, (e, seed) in enumerate(zip(exits, seeds, strict=True)):
            rows = slice(g * per_group, (g + 1) * per_group)
            alone.append(
                _module_rollout(model, model, *_rows(args, rows), exit_step=e, grad=False, seed=seed)
            )
    want = torch.cat(alone)

    def groups():
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        return RowGroups(gens, exits)

    module = CausalStreamer(model, SPEC, AXIS)
    got = _grouped_rollout(module, module.start, TextContext.build, *args, groups())
    runner = _runner(model, ReplicaMode(), "cpu")
    fast = runner.streamer(SPEC, AXIS, args[0])
    got_fast = _grouped_rollout(fast, lambda *a: runner.start(fast, *a), runner.cell_text, *args, groups())
    # the rows' GEMMs run at another M: equal up to fp32 rounding (here at most 7.8e-7 with one
    # row a group, bit for bit with two)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_fast, want, rtol=0, atol=1e-5)


def test_each_batch_size_keeps_its_own_cache_and_text_slot():
    """Stage 3 alternates a batch of the critic updates' rollouts and the generator's own batch:
    each batch size keeps its cache (and on a GPU its graphs), so neither rebuilds the other's."""
    torch.manual_seed(0)
    model = make_model(seed=3)
    runner = _runner(model, ReplicaMode(), "cpu")
    small, big = _inputs(batch=1, distinct=True), _inputs(batch=3, distinct=True)
    with torch.no_grad():
        ref = _module_rollout(model, model, *small, exit_step=3, grad=False, seed=5)
        first = _fast_rollout(runner, None, *small, exit_step=3, grad=False, seed=5)
        cache = runner.cache
        _fast_rollout(runner, None, *big, exit_step=2, grad=False, seed=6)
        assert runner.cache is not cache and sorted(runner.lanes) == [1, 3]
        again = _fast_rollout(runner, None, *small, exit_step=3, grad=False, seed=5)
    assert runner.cache is cache  # the batch-1 lane's buffers, reused
    assert torch.equal(first, ref) and torch.equal(again, ref)


def test_row_groups_refuse_grad_and_a_shared_generator():
    model = make_model(seed=3)
    streamer = CausalStreamer(model, SPEC, AXIS)
    anchor, banks, index, ids = _inputs(batch=2, distinct=True)
    with torch.no_grad():
        streamer.start(anchor, TextContext.build(banks[0], index), ids[:, cell_frame_slice(0)])
    groups = RowGroups([torch.Generator(), torch.Generator()], (3, 4))
    with pytest.raises(ValueError, match=r"exits \[3, 4\] outside 0..3"):
        streamer.step(TextContext.build(banks[1], index), ids[:, cell_frame_slice(1)], groups=groups)
    groups = RowGroups([torch.Generator(), torch.Generator()], (3, 1))
    with pytest.raises(ValueError, match="row groups carry their own generators"):
        streamer.step(
            TextContext.build(banks[1], index),
            ids[:, cell_frame_slice(1)],
            groups=groups,
            generator=torch.Generator(),
        )
    with pytest.raises(ValueError, match="3 rows do not split into 2 groups"):
        groups.noise(torch.zeros(3, 4))


def test_a_stale_replica_gives_another_rollout_and_load_refreshes_it():
    """The replica holds the weights it was loaded with (the stage reloads it per optimizer step)."""
    model = make_model(seed=3)
    runner = _runner(model, ReplicaMode(), "cpu")
    args = _inputs(batch=1, distinct=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
        ref = _module_rollout(model, model, *args, exit_step=3, grad=False)
        stale = _fast_rollout(runner, None, *args, exit_step=3, grad=False)
        runner.load(model.named_parameters(), version=1)
        fresh = _fast_rollout(runner, None, *args, exit_step=3, grad=False)
    assert not torch.equal(stale, ref) and torch.equal(fresh, ref)
    with pytest.raises(KeyError, match="not the replica's"):
        runner.load([("no.such.weight", torch.zeros(1))])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        (a.detach().float() - b.detach().float()).abs().max()
        / b.detach().float().abs().max().clamp_min(1e-12)
    )


def _grad_err(grads, exact) -> float:
    """The largest deviation from the exact gradients, relative to the largest exact gradient."""
    return max(_grad_errs(grads, exact))


def _grad_errs(grads, exact) -> list[float]:
    """Per parameter: its largest deviation from the exact gradient, relative to the largest exact
    gradient of all."""
    top = max(float(e.abs().max()) for e in exact)
    return [float((a.float() - e).abs().max()) / top for a, e in zip(grads, exact, strict=True)]


def _bf16_rollout_equality(kind: str, device: str, graph_modes: tuple[bool, ...]) -> None:
    """The replica run eagerly gives the training forward's rollout bit for bit (the same kernels),
    for FSDP's bf16 weights (inputs cast, bf16 autocast, fp32 outputs as accelerate gives) and for
    fp32 weights under bf16 autocast (the torch engine); so do its forwards replayed from CUDA
    graphs (``graph_modes`` True: one per fill level, the captured kernels are the eager ones),
    no-grad and with the grad exit forwards on the training forward.

    The exit forwards batched into one forward (``ExitCapture``, stage 3's default) give the same
    clip; their gradients come from other kernel shapes than the per-cell forwards', so both are
    read against the exact gradient of the same exits (an fp32 copy of the weights, no autocast, on
    the captured latents and snapshots): the batched one must be no further from it than the
    per-cell one (× 1.25, + 1e-3 of the largest gradient). The errors are printed."""
    dev = torch.device(device)
    master = make_model(seed=4).to(dev).train()
    master.check_sem_ids = False  # as train.model.build_model leaves a trained model
    exact = copy.deepcopy(master).float()
    if kind == "fsdp_bf16":
        mode = ReplicaMode(dtype=torch.bfloat16, autocast=True, cast_inputs=True, fp32_out=True)
        module = copy.deepcopy(master).to(torch.bfloat16)

        def forward(x, *a, **k):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                out = module(x.to(torch.bfloat16), *a, **k)
            return None if out is None else out.float()
    else:
        mode = ReplicaMode(dtype=torch.float32, autocast=True)
        module = master

        def forward(*a, **k):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                return module(*a, **k)

    def exact_forward(x, *a, **k):
        return exact(x.float(), *a, **k)

    args = _inputs(batch=2, distinct=True, device=device)
    params = [p for p in module.parameters() if p.requires_grad]
    exact_params = [p for p in exact.parameters() if p.requires_grad]
    with torch.no_grad():
        ref = _module_rollout(module, forward, *args, exit_step=3, grad=False, seed=5)
    x_ref = _module_rollout(module, forward, *args, exit_step=1, grad=True, seed=6)
    weight = torch.randn(x_ref.shape, generator=torch.Generator().manual_seed(4)).to(dev)
    g_ref = torch.autograd.grad((x_ref * weight).sum(), params)
    for graphs in graph_modes:
        runner = RolloutRunner(master, mode, dev, graphs=graphs)
        runner.load(master.named_parameters(), version=0)
        with torch.no_grad():
            for _ in range(2):  # with graphs: captures, then replays only
                fast = _fast_rollout(runner, None, *args, exit_step=3, grad=False, seed=5)
        x = _fast_rollout(runner, forward, *args, exit_step=1, grad=True, seed=6)
        g = torch.autograd.grad((x * weight).sum(), params)
        errs = [_rel(fast, ref), _rel(x, x_ref), *(_rel(a, b) for a, b in zip(g, g_ref, strict=True))]
        print(
            f"{kind} graphs={graphs}: rollout {errs[0]:.2e}, grad rollout {errs[1]:.2e}, grads max {max(errs[2:]):.2e}"
        )
        if graphs:
            assert runner.graphs is not None and runner.graphs.disabled is None, runner.graphs.disabled
            assert runner.graphs.replays > 0
        assert torch.equal(fast, ref) and torch.equal(x, x_ref), errs
        assert all(torch.equal(a, b) for a, b in zip(g, g_ref, strict=True)), errs
        # batched: the same clip (the rollout commits the replica's x0, equal to the module's)
        xb, exits = _fast_rollout_batched_exits(runner, forward, *args, exit_step=1, seed=6)
        gb = torch.autograd.grad((xb * weight).sum(), params)
        assert torch.equal(xb, x_ref), _rel(xb, x_ref)
        # the exact gradient of the same exits
        tail = exits.cells
        text = _exit_text(args[1], args[2], tail)
        x0 = exits.forward(exact_forward, text, args[3][:, cells_frame_slice(tail)], checkpoint=True)
        g_exact = torch.autograd.grad((x0 * weight[:, :, tail[0] - 1 :]).sum(), exact_params)  # x: cells 1..
        per_cell_err, batched_err = (_grad_err(grads, g_exact) for grads in (g, gb))
        names = [n for n, p in exact.named_parameters() if p.requires_grad]
        worst = sorted(zip(_grad_errs(gb, g_exact), _grad_errs(g, g_exact), names, strict=True))[-3:]
        print(f"{kind} graphs={graphs} vs fp32: per-cell exits {per_cell_err:.2e}, batched {batched_err:.2e}")
        print(
            "  worst batched (batched, per-cell, parameter):",
            [(f"{b:.1e}", f"{c:.1e}", n) for b, c, n in worst],
        )
        assert batched_err <= 1.25 * per_cell_err + 1e-3, (kind, graphs, per_cell_err, batched_err, worst)


@pytest.mark.parametrize("kind", ["fsdp_bf16", "torch_bf16"])
def test_bf16_rollout_equals_the_module_rollout(kind):
    """``_bf16_rollout_equality`` on the CPU's bf16 kernels (eager: no graphs here)."""
    _bf16_rollout_equality(kind, "cpu", (False,))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fsdp_bf16", "torch_bf16"])
def test_cuda_rollout_equals_the_module_rollout(kind):
    """``_bf16_rollout_equality`` on CUDA, eager and replayed from CUDA graphs."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _bf16_rollout_equality(kind, "cuda", (False, True))


def test_a_cell_with_the_previous_cells_prompts_keeps_the_text_memo():
    """Stage 3 names each cell's prompts (``key``): a cell whose key is the one the slot holds
    skips the memo (text embedding and every block's cross K/V) and rolls out the same; new weights
    (``load``) recompute it."""
    torch.manual_seed(0)
    model = make_model(seed=1)
    anchor, banks, index, ids = _inputs(batch=2, distinct=True)
    banks = [banks[c // 3 * 3] for c in range(CELLS)]  # the prompt changes every third cell
    keys = [f"prompt{c // 3}" for c in range(CELLS)]
    runner = _runner(model, ReplicaMode(), "cpu")
    slot = runner._lane(2).text
    memos = []
    orig = slot._memo

    def counted(raw, idx):
        memos.append(1)
        return orig(raw, idx)

    slot._memo = counted  # type: ignore[method-assign]
    by_bank = {id(b): k for b, k in zip(banks, keys, strict=True)}

    def keyed(raw, idx):
        return runner.cell_text(raw, idx, key=by_bank[id(raw)])

    def rollout(text):
        streamer = runner.streamer(SPEC, AXIS, anchor)
        return _rollout(
            streamer, lambda *a: runner.start(streamer, *a), text, anchor, banks, index, ids, 3, False, 2
        )

    with torch.no_grad():
        ref = _module_rollout(model, model, anchor, banks, index, ids, exit_step=3, grad=False, seed=2)
        assert torch.equal(rollout(runner.cell_text), ref)
        memos.clear()
        assert torch.equal(rollout(keyed), ref)
        assert len(memos) == 3  # one per distinct prompt run: cells 0-2, 3-5, 6-8
        memos.clear()
        runner.load(model.named_parameters(), version=1)
        assert torch.equal(rollout(keyed), ref) and len(memos) == 3  # the first cell recomputes


def test_a_compiled_replica_rolls_out_within_rounding_without_recompiling():
    """``compile=True`` (stage 3's ``rollout_compile`` on CUDA; here inductor's CPU code): the block
    bodies compiled with the KV attention left eager and the layer bound outside, so every block and
    every window fill level reuse the first compile (dynamo may not recompile at all), and the
    rollout equals the eager replica's up to floating-point rounding (fusion reorders fp32 sums)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make_model(seed=1)
    args = _inputs(batch=2, distinct=True)
    eager = _runner(model, ReplicaMode(), "cpu")
    compiled = RolloutRunner(model, ReplicaMode(), torch.device("cpu"), compile=True)
    compiled.load(model.named_parameters(), version=0)
    assert compiled.compiled
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        ref = _fast_rollout(eager, None, *args, exit_step=3, grad=False, seed=3)
        got = _fast_rollout(compiled, None, *args, exit_step=3, grad=False, seed=3)
        again = _fast_rollout(compiled, None, *args, exit_step=3, grad=False, seed=3)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    assert torch.equal(again, got)
    torch._dynamo.reset()


def test_the_query_cells_rotation_compiled_once_rolls_out_within_rounding():
    """``compile_rope`` (stage 3's ``rollout_compile_rope``): each block's q/k rotation in the
    eager KV attention runs as one compiled function. Its shapes are the query cell's at every fill
    level, so it compiles once for the batch (one entry in dynamo's cache of that function, no
    recompile over the rollout's blocks, cells and fill levels); the cached keys' rotation for each
    new query cell compiles once too, its token count symbolic over the fill levels. The rollout
    equals the eager replica's up to rounding. Without the body's compile both stay eager."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from gc25d_core.models.causal import apply_rope
    from gc25d_core.models.kv_cache import rotate_query_cell

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make_model(seed=1)
    args = _inputs(batch=2, distinct=True)
    assert not RolloutRunner(model, ReplicaMode(), torch.device("cpu"), compile_rope=True).compile_rope
    eager = _runner(model, ReplicaMode(), "cpu")
    fast = RolloutRunner(model, ReplicaMode(), torch.device("cpu"), compile=True, compile_rope=True)
    fast.load(model.named_parameters(), version=0)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        ref = _fast_rollout(eager, None, *args, exit_step=3, grad=False, seed=3)
        for fn in (rotate_query_cell, apply_rope):  # the eager runner's: none
            assert not _debug_get_cache_entry_list(fn.__code__)
        got = _fast_rollout(fast, None, *args, exit_step=3, grad=False, seed=3)
    assert len(_debug_get_cache_entry_list(rotate_query_cell.__code__)) == 1
    assert len(_debug_get_cache_entry_list(apply_rope.__code__)) == 1
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("compile_rope", [True, False], ids=["default", "eager_rope"])
def test_cuda_compiled_replica_under_graphs_stays_within_bf16_rounding(compile_rope):
    """Stage 3's default fast path on CUDA: the compiled replica's forwards (the KV attention's
    RoPE rotations compiled too, ``rollout_compile_rope``; ``eager_rope`` without) captured as
    CUDA graphs (the compile runs in the capture's warm-up) against the eager replica, FSDP-like
    bf16 weights:
    the clip within bf16 rounding (relative max error printed; bound 2e-2), the graphs on and
    replayed, and a second rollout bit-identical to the first."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch._dynamo.reset()
    master = make_model(seed=4).cuda()
    master.check_sem_ids = False
    mode = ReplicaMode(dtype=torch.bfloat16, autocast=True, cast_inputs=True, fp32_out=True)
    args = _inputs(batch=1, distinct=True, device="cuda")
    eager = RolloutRunner(master, mode, torch.device("cuda"), graphs=False)
    fast = RolloutRunner(
        master, mode, torch.device("cuda"), graphs=True, compile=True, compile_rope=compile_rope
    )
    for r in (eager, fast):
        r.load(master.named_parameters(), version=0)
    with torch.no_grad():
        ref = _fast_rollout(eager, None, *args, exit_step=3, grad=False, seed=5)
        got = [_fast_rollout(fast, None, *args, exit_step=3, grad=False, seed=5) for _ in range(2)]
    err = _rel(got[0], ref)
    print(f"compiled + graphs vs eager replica: max rel {err:.2e}")
    assert fast.graphs is not None and fast.graphs.disabled is None, fast.graphs.disabled
    assert fast.graphs.replays > 0
    assert torch.equal(got[0], got[1])
    assert err <= 2e-2, err
    torch._dynamo.reset()


def test_cell_views_take_consecutive_snapshots_of_the_per_cell_cache_only():
    """A snapshot holds references that later commits never rewrite: only the per-cell KVCache
    gives them (the static cache compacts its buffers in place)."""
    from gc25d_core.models.kv_cache import CellViews

    model = make_model(seed=2)
    static = model.new_kv_cache(SPEC, (4, 6), static=True)
    with pytest.raises(TypeError, match="per-cell KVCache"):
        static.snapshot(1)
    cache = model.new_kv_cache(SPEC, (4, 6))
    a, b = cache.snapshot(1), cache.snapshot(3)
    with pytest.raises(ValueError, match="consecutive cells"):
        CellViews(SPEC, (2, 3), [a, b])
    with pytest.raises(ValueError, match="a kv_cache.CellViews"):
        model(torch.zeros(1, 48, 1, 4, 6), 500.0, torch.zeros(1, 16, 64), mode="kv_cells", cache=cache)
