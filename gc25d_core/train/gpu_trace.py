"""How busy the GPU was over a torch.profiler window, from its Chrome trace: the union of kernel and
device-copy intervals (all streams) against the window, and the idle gaps between them. Answers
"does the GPU wait for the host?" (gaps) apart from "which kernels are slow?" (ops.txt). A
collective kernel counts as busy while it waits for its peer: a stall there is not a gap.

Hand-written because the profiler reports per-op device time only, with no union over streams."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# kernel name -> what it does, first match wins (fused attention before the GEMM names: CUTLASS and
# flash kernels share words). Names as torch 2.11 on sm90 writes them: cuBLASLt ``nvjet_*`` /
# ``sm90_xmma_*``, inductor ``triton_{poi,red,per}_*`` and flex templates ``*flex_attention*``.
KERNEL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx, re.IGNORECASE))
    for kind, rx in (
        ("collective", r"nccl"),
        ("attention_flex", r"flex_attention|flex_decoding"),
        ("attention_fused", r"flash|fmha|efficient_attention|attention"),
        ("gemm", r"nvjet|gemm|xmma|cutlass|cublas|wgmma"),
        ("optimizer", r"adam|multi_tensor"),
        ("triton_fused", r"^triton_"),
        ("aten_elementwise", r"elementwise|reduce_kernel|copy|fill|index|cat|unrolled"),
    )
)


def device_intervals(trace: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(start, end) in µs of every device event (kernels, copies, sets) of a Chrome trace, sorted."""
    out = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES
    ]
    return sorted(out)


def kernel_kind(name: str) -> str:
    for kind, rx in KERNEL_KINDS:
        if rx.search(name):
            return kind
    return "other"


def device_time_by_kind(trace: Mapping[str, Any], per: float = 1.0) -> dict[str, dict[str, float]]:
    """Device seconds and event counts per kind of work over the window (``KERNEL_KINDS``; copies and
    sets by their trace category), divided by ``per`` (the profiled steps): a sum over streams, so
    overlapping streams count twice, unlike ``busy_summary``. Sorted by time, largest first."""
    acc: dict[str, list[float]] = {}
    for e in trace.get("traceEvents", []):
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in DEVICE_CATEGORIES:
            continue
        kind = kernel_kind(str(e.get("name", ""))) if cat == "kernel" else cat
        slot = acc.setdefault(kind, [0.0, 0.0])
        slot[0] += float(e.get("dur", 0.0)) / 1e6
        slot[1] += 1
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])
    return {k: {"s": round(s / per, 6), "n": round(n / per, 1)} for k, (s, n) in rows}


def busy_summary(
    intervals: Iterable[tuple[float, float]], gap_us: float = 500.0, top: int = 8
) -> dict[str, Any]:
    """Union of the intervals: window (first start to last end), busy and idle seconds, and the idle
    gaps of at least ``gap_us`` (count, seconds, the ``top`` longest with their offset in the window)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if not merged:
        return {
            "window_s": 0.0,
            "busy_s": 0.0,
            "idle_s": 0.0,
            "busy_frac": 0.0,
            "gaps": 0,
            "gaps_s": 0.0,
            "longest_gaps": [],
        }
    t0, t1 = merged[0][0], merged[-1][1]
    busy = sum(e - s for s, e in merged)
    gaps = [
        (b[0] - a[1], a[1] - t0)
        for a, b in zip(merged[:-1], merged[1:], strict=True)
        if b[0] - a[1] >= gap_us
    ]
    gaps.sort(reverse=True)
    window = t1 - t0
    return {
        "window_s": window / 1e6,
        "busy_s": busy / 1e6,
        "idle_s": (window - busy) / 1e6,
        "busy_frac": busy / window if window > 0 else 0.0,
        "gaps": len(gaps),
        "gaps_s": sum(g for g, _ in gaps) / 1e6,
        "longest_gaps": [{"ms": round(g / 1e3, 3), "at_s": round(at / 1e6, 4)} for g, at in gaps[:top]],
    }
