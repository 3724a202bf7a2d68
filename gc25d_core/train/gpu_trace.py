"""How busy the GPU was over a torch.profiler window, from its Chrome trace: the union of kernel and
device-copy intervals (all streams) against the window, and the idle gaps between them. Answers
"does the GPU wait for the host?" (gaps) apart from "which kernels are slow?" (ops.txt). A
collective kernel counts as busy while it waits for its peer: a stall there is not a gap.

Hand-written because the profiler reports per-op device time only, with no union over streams."""

from __future__ import annotations

import bisect
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


PHASE_PREFIX = "phase:"
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")


def phase_summary(trace: Mapping[str, Any], prefix: str = PHASE_PREFIX, top: int = 12) -> dict[str, Any]:
    """Per labelled host range (``torch.profiler.record_function(prefix + label)``, the bench's phase
    timer brackets each with a device sync): how often it ran, its wall seconds, the GPU's busy
    seconds inside it (union over streams), the device seconds per kind of work, its ``top`` kernels
    by device time and its ``top`` host calls. A range's device work is what starts inside it: with
    the sync at its end, that is the work it launched. Ranges nested in a range of another label
    count for both."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    windows: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith(prefix):
            start = float(e["ts"])
            windows.setdefault(name[len(prefix) :], []).append((start, start + float(e.get("dur", 0.0))))
    device = sorted(
        (
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e)
            for e in events
            if e.get("cat") in DEVICE_CATEGORIES
        ),
        key=lambda d: (d[0], d[1]),
    )
    starts = [d[0] for d in device]
    host = sorted(
        (
            (float(e["ts"]), float(e.get("dur", 0.0)), str(e.get("name", "")))
            for e in events
            if e.get("cat") in HOST_CATEGORIES
        ),
        key=lambda h: h[0],
    )
    host_starts = [h[0] for h in host]
    out: dict[str, Any] = {}
    for label, spans in sorted(windows.items()):
        wall = busy = 0.0
        kinds: dict[str, float] = {}
        kernels: dict[str, list[float]] = {}
        calls: dict[str, list[float]] = {}
        for lo, hi in spans:
            wall += hi - lo
            for _, dur, name in host[
                bisect.bisect_left(host_starts, lo) : bisect.bisect_right(host_starts, hi)
            ]:
                slot = calls.setdefault(name[:90], [0.0, 0])
                slot[0] += dur
                slot[1] += 1
            inside = device[bisect.bisect_left(starts, lo) : bisect.bisect_right(starts, hi)]
            busy += busy_summary((s, min(e, hi)) for s, e, _ in inside)["busy_s"] * 1e6
            for s, e, ev in inside:
                name = str(ev.get("name", ""))
                kind = kernel_kind(name) if ev.get("cat") == "kernel" else str(ev.get("cat"))
                kinds[kind] = kinds.get(kind, 0.0) + (e - s)
                slot = kernels.setdefault(name[:90], [0.0, 0])
                slot[0] += e - s
                slot[1] += 1
        out[label] = {
            "n": len(spans),
            "wall_s": round(wall / 1e6, 6),
            "busy_s": round(busy / 1e6, 6),
            "busy_frac": round(busy / wall, 4) if wall > 0 else 0.0,
            "by_kind_s": {k: round(v / 1e6, 6) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top_kernels": [
                {"name": k, "s": round(v[0] / 1e6, 6), "n": int(v[1])}
                for k, v in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
            ],
            # host calls (operators and CUDA runtime calls) by inclusive seconds: nested ones count twice
            "top_host": [
                {"name": k, "s": round(v[0] / 1e6, 6), "n": int(v[1])}
                for k, v in sorted(calls.items(), key=lambda kv: -kv[1][0])[:top]
            ],
        }
    return out
