"""FP8 GEMMs for the DiT's linear layers in deploy (issue 34 item 1), through torchao's float8 inference.

``apply_fp8(model, skip=...)`` swaps the weights of the chosen ``nn.Linear`` layers for torchao
``Float8Tensor``s (e4m3, one scale per output row) whose matmuls quantise each activation row on
the fly and run ``torch._scaled_mm`` (cuBLASLt FP8 on Hopper: twice the bf16 tensor-core rate).
torchao is PyTorch's own maintained quantisation library and its float8 path is the one the
Hopper inference stacks use (per-row dynamic scaling, no calibration); the swap is in place and
happens before the runtime captures its CUDA graphs, so the graphs replay the FP8 kernels (the
dynamic scales are device ops: nothing syncs with the host inside a forward).

Which layers: the 30 blocks' attention projections and FFNs (``blocks.*``), the work per cell; the
cross-attention's K / V are left out (computed once per session from the text bank, no gain) and
so are the embeddings, the time projection and the head (small, and the error budget's first
and last layers). ``skip`` adds fnmatch patterns of module names to leave in bf16 (per-layer
opt-out, e.g. ``blocks.0.*`` or ``*.ffn.2``).

Needs a CUDA device of compute capability 8.9+ (Ada / Hopper) and the optional ``torchao`` package
(``pip install gc25d[fp8]``); without either it refuses with the reason, before touching the model.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from collections.abc import Sequence

import torch

INCLUDE = ("blocks.*",)
DEFAULT_SKIP = ("blocks.*.cross_attn.k", "blocks.*.cross_attn.v")


class Fp8Unavailable(ValueError):
    """FP8 asked for where it cannot run (no CUDA, an older GPU, no torchao): a ValueError, which the
    deploy CLI reports as an error line."""


def fp8_layer_names(model: torch.nn.Module, skip: Sequence[str] = ()) -> list[str]:
    """The ``nn.Linear`` modules ``apply_fp8`` converts: under ``INCLUDE``, not matching
    ``DEFAULT_SKIP`` or ``skip``."""
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        if not any(fnmatch.fnmatchcase(name, p) for p in INCLUDE):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in (*DEFAULT_SKIP, *skip)):
            continue
        out.append(name)
    return out


# The DiT width from which FP8 is the deploy default on CUDA (``RuntimeOptions.fp8 = "auto"``, the
# CLI's default): the width where the whole loop measured it faster than bf16 within its error
# bound (the 5B's 3072), not the `small` preset's 1024, where quantising each activation row costs
# what the FP8 GEMMs save (docs/decisions.md, docs/benchmarks.md).
AUTO_MIN_DIM = 3072


def fp8_problems(device: torch.device | str) -> list[str]:
    """Every reason FP8 GEMMs cannot run on ``device`` (empty where they can)."""
    dev = torch.device(device)
    problems = []
    if dev.type != "cuda":
        problems.append(f"a CUDA device with FP8 tensor cores (the model is on {dev})")
    elif torch.cuda.get_device_capability(dev) < (8, 9):
        cap = torch.cuda.get_device_capability(dev)
        problems.append(f"compute capability 8.9+ (Ada / Hopper; {dev} has {cap[0]}.{cap[1]})")
    if importlib.util.find_spec("torchao") is None:
        problems.append("the optional torchao package (pip install 'gc25d[fp8]': torchao==0.18.0)")
    return problems


def check_fp8(device: torch.device | str) -> None:
    """Raise ``Fp8Unavailable`` naming every reason FP8 GEMMs cannot run on ``device``."""
    problems = fp8_problems(device)
    if problems:
        raise Fp8Unavailable("fp8 needs " + " and ".join(problems))


def auto_fp8(dim: int, device: torch.device | str) -> tuple[bool, str]:
    """``auto``'s choice for a DiT of width ``dim`` on ``device``, and why (a line for the log)."""
    problems = fp8_problems(device)
    if problems:
        return False, "fp8 off: it needs " + " and ".join(problems)
    if dim < AUTO_MIN_DIM:
        return (
            False,
            f"fp8 off: dim {dim} < {AUTO_MIN_DIM}, where it measured no faster than bf16 (--fp8 forces it)",
        )
    return True, f"fp8 on: dim {dim} >= {AUTO_MIN_DIM} on {torch.device(device)} (--no-fp8 turns it off)"


def apply_fp8(model: torch.nn.Module, skip: Sequence[str] = ()) -> list[str]:
    """Convert the model's chosen linear layers to FP8 (in place); returns their names."""
    device = next(model.parameters()).device
    check_fp8(device)
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    names = set(fp8_layer_names(model, skip))
    if not names:
        raise ValueError(f"fp8: no linear layer left to convert (skip = {list(skip)})")
    for name in names:
        weight = model.get_submodule(name).weight
        if weight.dtype != torch.bfloat16:
            raise ValueError(f"fp8: {name}.weight is {weight.dtype}; the FP8 path quantises a bf16 model")
    # set_inductor_config=False: nothing here is compiled, and the process-wide inductor switches
    # are left as the runtime's other options set them
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)
    quantize_(model, config, filter_fn=lambda m, fqn: fqn in names)
    return sorted(names)
