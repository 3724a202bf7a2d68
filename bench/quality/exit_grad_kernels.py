"""Which CUDA kernel puts stage 3's batched exit forwards' gradients further from exact than the
per-cell exit forwards' (issue 33; docs/benchmarks/2026-12-03_stage3-exits_h200.md).

Runs ``tests/models/test_fast_rollout.py::test_cuda_rollout_equals_the_module_rollout`` once per
kernel setting, in one process (the switches are torch's global backend flags, set before each
run and reset after it), and prints one JSON line: per setting, pytest's exit code and the lines
the test prints (each kind's per-cell and batched deviation from the fp32 gradient of the same
exits, and the three worst parameters). A setting whose batched deviation falls to the per-cell
one's names the kernel that loses the precision.

Usage (GPU machine, repository root): python3 -m bench.quality.exit_grad_kernels
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.common import print_result

TEST = "tests/models/test_fast_rollout.py::test_cuda_rollout_equals_the_module_rollout"


@contextlib.contextmanager  # torch has no context manager for the matmul flag (cuDNN's: cudnn.flags)
def _set(getter: Callable[[], bool], setter: Callable[[bool], None], value: bool) -> Iterator[None]:
    old = getter()
    setter(value)
    try:
        yield
    finally:
        setter(old)


def _only_sdpa(backend: str) -> contextlib.AbstractContextManager[None]:
    """SDPA limited to ``backend`` where it applies, the math kernel elsewhere (the fp32 reference
    forward, which the flash kernel does not take)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, backend), SDPBackend.MATH])


def settings() -> dict[str, Callable[[], contextlib.AbstractContextManager[None]]]:
    cuda = torch.backends.cuda
    return {
        "default": contextlib.nullcontext,
        "no_cudnn": lambda: torch.backends.cudnn.flags(enabled=False),
        "no_bf16_reduced_reduction": lambda: _set(
            lambda: cuda.matmul.allow_bf16_reduced_precision_reduction,
            lambda v: setattr(cuda.matmul, "allow_bf16_reduced_precision_reduction", v),
            False,
        ),
        "sdpa_flash": lambda: _only_sdpa("FLASH_ATTENTION"),
        "sdpa_efficient": lambda: _only_sdpa("EFFICIENT_ATTENTION"),
        "sdpa_cudnn": lambda: _only_sdpa("CUDNN_ATTENTION"),
        "sdpa_math": lambda: _only_sdpa("MATH"),
    }


def main(argv: list[str] | None = None) -> None:
    import argparse

    import pytest

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test", default=TEST, help="the test to run (the CPU twin checks the plumbing)")
    args = ap.parse_args(argv)
    if args.test == TEST and not torch.cuda.is_available():
        raise SystemExit(
            "exit_grad_kernels: needs CUDA (the CPU's kernels agree: tests/models/test_fast_rollout.py)"
        )
    out: dict[str, Any] = {"probe": "exit_grad_kernels", "test": args.test}
    for name, setting in settings().items():
        buf = io.StringIO()
        with setting(), contextlib.redirect_stdout(buf):
            rc = pytest.main(["-q", "-s", "-m", "gpu or not gpu", "-p", "no:cacheprovider", args.test])
        text = buf.getvalue().splitlines()
        lines = [ln.strip() for ln in text if "vs fp32" in ln or "worst batched" in ln]
        if not lines:  # it failed before its comparison (cuDNN off did): the end of pytest's report
            lines = [ln.rstrip() for ln in text[-15:]]
        out[name] = {"rc": int(rc), "lines": lines}
        print(name, int(rc), *lines, sep="\n  ", flush=True)
    print_result(out, None)


if __name__ == "__main__":
    main()
