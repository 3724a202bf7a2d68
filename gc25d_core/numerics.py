"""What a run's numbers depend on beyond its config: the CPU, its kernels' code paths, torch, the
accelerator. A CPU chain's tables match to the digit only between boxes that agree here: the
Makefile pins the kernels' instruction sets (AVX2), but MKL honours its branch pin on Intel CPUs
only, so an Intel box and an AMD box round the same GEMMs differently and a 400-step SFT carries
that into every digit (docs/learning_signal.md, "`make run` on an Intel Xeon"). The records that
keep it: a training run's done.json and state slots (the teacher's table prints it), the tiny VAE
fit's tiny_vae.json and each kept eval row (the eval table prints it, and names the rows computed
under other numerics), so a reader comparing two tables can tell a code change from another box."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# the environment variables that choose the CPU kernels' code paths (the Makefile and tests/__init__.py set them)
NUMERICS_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE")


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, str]:
    """(vendor, model name) of the first CPU in ``cpuinfo``; ("unknown", "unknown") where it cannot
    be read (not Linux, a container that hides it)."""
    vendor = model = "unknown"
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return vendor, model
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and vendor == "unknown":
            vendor = value
        elif key == "model name" and model == "unknown":
            model = value
        if vendor != "unknown" and model != "unknown":
            break
    return vendor, model


def numerics_record(device_type: str = "cpu") -> dict[str, Any]:
    """This process's record: the CPU, the code path ATen took, the pins as set (None: unset),
    torch's version and threads, and the accelerator's name on CUDA."""
    import torch

    vendor, model = cpu_identity()
    record: dict[str, Any] = {
        "cpu_vendor": vendor,
        "cpu": model,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pins": {name: os.environ.get(name) for name in NUMERICS_PINS},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device_type == "cuda" and torch.cuda.is_available():
        record["accelerator"] = torch.cuda.get_device_name()
    return record


def numerics_line(record: dict[str, Any]) -> str:
    """One line for a report: "numerics: AuthenticAMD AMD EPYC 7B13, ATen AVX2, MKL_CBWR=AVX2, ..."."""
    pins = record.get("pins") or {}
    parts = [
        f"{record.get('cpu_vendor', 'unknown')} {record.get('cpu', 'unknown')}",
        f"ATen {record.get('aten_cpu_capability', '?')}",
        *(f"{name}={pins[name]}" for name in NUMERICS_PINS if pins.get(name) is not None),
        f"torch {record.get('torch', '?')}",
        f"{record.get('threads', '?')} threads a rank",
    ]
    if record.get("accelerator"):
        parts.append(str(record["accelerator"]))
    return "numerics: " + ", ".join(parts)


def numerics_differ(saved: Any, now: dict[str, Any]) -> str | None:
    """What differs between the numerics a state was saved under and this process's, as
    "field: saved -> now; ..."; None where they agree or the state kept none (saved before runs
    recorded them)."""
    if not isinstance(saved, dict):
        return None
    changes = []
    for key in sorted(set(saved) | set(now)):
        if key == "pins":
            a, b = saved.get("pins") or {}, now.get("pins") or {}
            changes += [f"{n}: {a.get(n)} -> {b.get(n)}" for n in NUMERICS_PINS if a.get(n) != b.get(n)]
        elif saved.get(key) != now.get(key):
            changes.append(f"{key}: {saved.get(key)} -> {now.get(key)}")
    return "; ".join(changes) or None


# ATen's float unary ops that may run on MKL's vector maths (aten/src/ATen/cpu/vml.h); those it now
# runs on its own vector code cost nothing to warm
VML_OPS = (
    "abs", "acos", "asin", "atan", "cos", "erf", "erfc", "exp", "expm1",
    "log", "log10", "log1p", "log2", "sin", "sqrt", "tan", "tanh", "trunc",
)  # fmt: skip


def resolve_vml_dispatch() -> None:
    """Run each of MKL's vector-maths ops once, on one element, on this thread, before any of them
    runs on several intra-op threads at once. Written by hand because the fix is not in the torch we
    pin (pytorch/pytorch#188792, PR #188791 open): oneMKL picks each function's kernel on its first
    call, and first calls racing on several threads can run one thread's chunk of that call on a
    low-accuracy kernel. Here it hit Adam's first ``sqrt`` in the tiny VAE's 2-thread fit, in some
    fresh processes and not others, so the fit's weights, and every table after them, changed from
    run to run (docs/learning_signal.md, session 47). A 1-element op runs inline on the calling
    thread, so its first call settles the dispatch for every thread after it. Idempotent; a few
    milliseconds."""
    import torch

    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)
        for op in VML_OPS:
            getattr(torch, op)(x)
