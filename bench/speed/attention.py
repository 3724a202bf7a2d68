"""Self-attention alone at the 5B training shape, forward + backward, per kernel. Prints JSON lines.

One clip of the SFT: q, k, v [1, 8190, 24, 128] bf16 (21 cells of 15x26 tokens, 24 heads of 128), no
mask. Kernels: PyTorch SDPA with its default pick (cuDNN on an H200), SDPA restricted to its flash
(FA2) or cuDNN kernel, and FlashAttention-4 (``gc25d_core.models.fa4``, optional flash-attn-4
package), each called the way GcDiT calls it. FLOPs = 4·s²·d·heads forward, ×3 forward + backward (the MFU
convention of bench/common.py), timed with CUDA events, median of --reps after --warmup.

``--mask tf``: the teacher-forcing attention of stages 1–2 instead ([clean | noisy] = 2 × 21 cells of
390 tokens = 16,380, the block mask of ``models.causal``), FLOPs counted at the pairs the mask allows;
kernels = flex attention (compiled, as GcDiT calls it) with the kernel options of ``FLEX_VARIANTS``
(``flex_flash`` = flex's FlashAttention-4 CuTe backend, needs flash-attn-4), and SDPA with the dense
boolean mask as the reference.

``--kv``: the deploy's KV step instead, forward only: one query cell (390 tokens) over the static
cache's buffers at each window fill level (``--kv-cells`` cached cells + its own; 19 = the steady
state of sink 3 + window 17), SDPA (its default pick, its flash and cuDNN kernels) and FA4; per fill level
its time under a CUDA graph of 30 calls (as the loop replays it; ``eager_us`` beside it: one call
from the host, whose overhead a graph hides), and at the steady state a cell's worth (5 forwards x
30 blocks).

Usage: python -m bench.speed.attention [--seq 8190] [--reps 20] [--kernels sdpa,sdpa_flash,fa4]
       python -m bench.speed.attention --mask tf --kernels flex,flex_tma,sdpa_mask
       python -m bench.speed.attention --kv [--kv-cells 1,4,8,12,16,19]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

Attn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa(heads: int, backend: object | None) -> Attn:
    """[B, S, H*D] in and out, through SDPA's [B, H, S, D] layout (GcDiT's sdpa path)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, hd = q.shape  # k, v may be longer (--kv: the cached cells' keys too)
        q4, k4, v4 = (x.view(b, x.shape[1], heads, hd // heads).transpose(1, 2) for x in (q, k, v))
        if backend is None:
            out = F.scaled_dot_product_attention(q4, k4, v4)
        else:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(backend):  # type: ignore[arg-type]
                out = F.scaled_dot_product_attention(q4, k4, v4)
        return out.transpose(1, 2).reshape(b, s, hd)

    return run


# flex attention kernel options (torch FlexKernelOptions) tried at the teacher-forcing shape
FLEX_VARIANTS: dict[str, dict[str, object]] = {
    "flex": {},
    "flex_tma": {"USE_TMA": True},
    "flex_safe": {"ROWS_GUARANTEED_SAFE": True},  # every query sees at least its own cell
    "flex_tma_safe": {"USE_TMA": True, "ROWS_GUARANTEED_SAFE": True},
    "flex_m128n128w8": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "flex_m128n64w4s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "flex_bwd64": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64},
    "flex_flash": {"BACKEND": "FLASH"},
}


def tf_kernels(heads: int, cells: int, tokens_per_cell: int) -> tuple[dict[str, Attn], float]:
    """The teacher-forcing kernels and the fraction of query-key pairs the mask allows."""
    from gc25d_core.models.causal import _flex_attention, flex_block_mask, group_mask, sdpa
    from gc25d_core.models.configs import FULL_CAUSAL

    gm = group_mask(cells, FULL_CAUSAL, teacher_forcing=True, device=torch.device("cuda"))
    block_mask = flex_block_mask(gm, tokens_per_cell)
    dense = gm.repeat_interleave(tokens_per_cell, 0).repeat_interleave(tokens_per_cell, 1)

    def flex(options: dict[str, object]) -> Attn:
        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            b, s, hd = q.shape
            q4, k4, v4 = (x.view(b, s, heads, hd // heads).transpose(1, 2) for x in (q, k, v))
            out = _flex_attention(q4, k4, v4, block_mask, options)
            return out.transpose(1, 2).reshape(b, s, hd)

        return run

    table: dict[str, Attn] = {name: flex(opts) for name, opts in FLEX_VARIANTS.items()}
    table["sdpa_mask"] = lambda q, k, v: sdpa(q, k, v, heads, dense)
    return table, float(gm.float().mean())


def kernels(heads: int) -> dict[str, Attn]:
    from torch.nn.attention import SDPBackend

    from gc25d_core.models.fa4 import fa4_attention

    return {
        "sdpa": sdpa(heads, None),
        "sdpa_flash": sdpa(heads, SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa(heads, SDPBackend.CUDNN_ATTENTION),
        "fa4": lambda q, k, v: fa4_attention(q, k, v, heads),
    }


def time_fwd_bwd(
    fn: Attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, warmup: int, reps: int
):
    """(forward s, forward + backward s), medians; the last output and q/k/v gradients for the check."""
    fwd, both = [], []
    for i in range(warmup + reps):
        for x in (q, k, v):
            x.grad = None
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        out = fn(q, k, v)
        e1.record()
        out.backward(grad)
        e2.record()
        torch.cuda.synchronize()
        if i >= warmup:
            fwd.append(e0.elapsed_time(e1) / 1e3)
            both.append(e0.elapsed_time(e2) / 1e3)
    return statistics.median(fwd), statistics.median(both), out.detach(), [x.grad.clone() for x in (q, k, v)]


def time_fwd(fn: Attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, warmup: int, reps: int):
    """(forward s median, the last output): no grad, as the deploy calls it."""
    times = []
    with torch.no_grad():
        for i in range(warmup + reps):
            e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            e0.record()
            out = fn(q, k, v)
            e1.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(e0.elapsed_time(e1) / 1e3)
    return statistics.median(times), out


def time_fwd_graphed(fn: Attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, calls: int, replays: int):
    """(forward s per call, median over ``replays`` replays of a CUDA graph of ``calls`` calls), as
    the deploy's KV step runs under its graphs: the host's share of a call (FA4's Python interface
    is ~0.1 ms of it) is not in the figure, as it is not in the loop. Warm (compiled) beforehand."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(q, k, v)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn(q, k, v)
    times = []
    for _ in range(replays):
        e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / calls)
    return statistics.median(times)


def kv_step(args: argparse.Namespace, table: dict[str, Attn], names: list[str]) -> None:
    """The KV step's attention per fill level (see the module's docstring) with the kernels
    ``names``, one JSON line each."""
    hd, n = args.heads * args.head_dim, args.tokens_per_cell
    levels = [int(c) for c in args.kv_cells.split(",")]
    steady = max(levels)
    for cells in levels:
        q = torch.randn(1, n, hd, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, (cells + 1) * n, hd, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = 4 * n * (cells + 1) * n * hd
        ref = None
        for name in names:
            try:
                eager, out = time_fwd(table[name], q, k, v, args.warmup, args.reps)
                t = time_fwd_graphed(table[name], q, k, v, calls=30, replays=args.reps)
            except Exception as e:  # a kernel that cannot run here is reported, the others still run
                print(json.dumps({"probe": "attn_kv", "kernel": name, "error": repr(e)[:400]}), flush=True)
                continue
            if ref is None:
                ref = out.float()
            row = {
                "probe": "attn_kv",
                "kernel": name,
                "cached_cells": cells,
                "q_tokens": n,
                "kv_tokens": (cells + 1) * n,
                "fwd_us": round(t * 1e6, 1),  # under a CUDA graph, as the loop runs it
                "fwd_tflops": round(flops / t / 1e12, 1),
                "eager_us": round(eager * 1e6, 1),  # one call launched from the host, its overhead in
                "out_rel_err_vs_first": round(((out.float() - ref).norm() / ref.norm()).item(), 5),
            }
            if cells == steady:  # a steady cell: 4 denoise forwards + the commit, 30 blocks each
                row["per_cell_ms"] = round(t * 5 * 30 * 1e3, 2)
            print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8190)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--kernels", default="sdpa,sdpa_flash,sdpa_cudnn,fa4")
    p.add_argument("--mask", choices=("none", "tf"), default="none")
    p.add_argument("--cells", type=int, default=21, help="--mask tf: cells per half")
    p.add_argument("--tokens-per-cell", type=int, default=390)
    p.add_argument("--kv", action="store_true", help="the deploy's KV step (forward only) instead")
    p.add_argument("--kv-cells", default="1,4,8,12,16,19", help="--kv: cached cells per fill level")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    torch.manual_seed(0)
    if args.kv:  # --kernels as for the full sequence (default: SDPA's pick, its flash and cuDNN, FA4)
        kv_step(args, kernels(args.heads), args.kernels.split(","))
        return
    hd = args.heads * args.head_dim
    allowed = 1.0
    if args.mask == "tf":
        torch._dynamo.config.cache_size_limit = 64  # one compiled flex per kernel-option set
        args.seq = 2 * args.cells * args.tokens_per_cell
        table, allowed = tf_kernels(args.heads, args.cells, args.tokens_per_cell)
    else:
        table = kernels(args.heads)
    q, k, v = (
        torch.randn(1, args.seq, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn_like(q)  # one upstream gradient for every kernel, so their gradients compare
    flops_fwd = 4 * args.seq**2 * hd * allowed
    ref = None
    for name in args.kernels.split(","):
        try:
            t_fwd, t_both, out, grads = time_fwd_bwd(table[name], q, k, v, grad, args.warmup, args.reps)
        except Exception as e:  # a kernel that cannot run here is reported, the others still run
            print(json.dumps({"probe": "attn", "kernel": name, "error": repr(e)[:400]}), flush=True)
            continue
        if ref is None:
            ref = (out.float(), [g.float() for g in grads])
        rel = [((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, ref[1], strict=True)]
        print(
            json.dumps(
                {
                    "probe": "attn",
                    "kernel": name,
                    "seq": args.seq,
                    "mask": args.mask,
                    "allowed_pairs": round(allowed, 4),
                    "fwd_ms": round(t_fwd * 1e3, 3),
                    "fwd_bwd_ms": round(t_both * 1e3, 3),
                    "fwd_tflops": round(flops_fwd / t_fwd / 1e12, 1),
                    "fwd_bwd_tflops": round(3 * flops_fwd / t_both / 1e12, 1),
                    "out_rel_err_vs_first": round(((out.float() - ref[0]).norm() / ref[0].norm()).item(), 5),
                    "grad_rel_err_vs_first": [round(x, 5) for x in rel],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
