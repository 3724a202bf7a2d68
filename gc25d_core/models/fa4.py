"""FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL kernels for Hopper and Blackwell) for
the bidirectional full-sequence self-attention: ``GcDiT.attn_backend = "fa4"``.

Why: on an H200 the SFT step's GEMMs run at ~720 TFLOP/s but PyTorch SDPA's cuDNN attention at
~380 (forward + backward), 27 % of the step (docs/benchmarks.md, SFT). FA4 takes the [B, S, H, D]
layout our projections already have, so no transposes either. It is optional: the package (and its
``nvidia-cutlass-dsl`` runtime) is not a project dependency, and masked or causal attention keeps
SDPA / flex. Its kernels are compiled at run time by the CuTe DSL, outside torch.compile, so the
call is a graph break inside a compiled block. (PyTorch's own FA4 hook behind SDPA's flash op,
``torch.nn.attention.activate_flash_attention_impl("FA4")``, would avoid the break, but torch 2.11's
hook unpacks two values from ``_flash_attn_fwd`` and flash-attn-4 4.0.0b36 returns five: tried on
the H200 on 2026-11-30, docs/decisions.md.)

The package's top-level module is ``flash_attn``, the name DiffSynth probes for FlashAttention-2;
with flash-attn-4 installed, DiffSynth's own Wan attention would take its FA2 branch and fail.
``gc25d_core.compat.import_diffsynth`` corrects that probe in our processes; scripts that import
DiffSynth directly (the plain-stack comparator) still need the package kept off their path
(bench/suites.py gives it a folder of its own).
"""

from __future__ import annotations

import importlib.util

import torch


def fa4_available() -> bool:
    """The package is importable (the GPU still has to be sm90 or newer)."""
    return importlib.util.find_spec("flash_attn") is not None and (
        importlib.util.find_spec("flash_attn.cute") is not None
    )


def fa4_problem(device: torch.device | str) -> str | None:
    """What keeps FA4 from running on ``device`` ("needs ..."), or None where it can."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"needs a CUDA device, got {device}"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return f"needs sm90 or newer, {device} is {torch.cuda.get_device_name(device)}"
    if not fa4_available():
        return "needs the flash-attn-4 package (flash_attn.cute)"
    return None


def check_fa4(device: torch.device | str, what: str = "attn_backend='fa4'") -> None:
    """Raise, saying what is missing, unless FA4 can run on ``device`` (``what`` asked for it)."""
    problem = fa4_problem(device)
    if problem is not None:
        raise RuntimeError(f"{what} {problem}")


# the DiT width where FA4 as the KV step's attention measured faster than SDPA in the whole live loop
# under the CUDA graphs (the 5B's, docs/benchmarks.md); narrower models keep SDPA until measured
AUTO_KV_MIN_DIM = 3072


def auto_kv_attention(dim: int, dtype: torch.dtype, device: torch.device | str) -> tuple[str, str]:
    """The deploy's ``kv_attention='auto'`` for a DiT of width ``dim`` in ``dtype`` on ``device``
    over the static KV buffers: ("fa4" or "sdpa", why, as a line for the log)."""
    problem = fa4_problem(device)
    if problem is not None:
        return "sdpa", f"kv attention sdpa: FlashAttention-4 {problem}"
    if dtype not in (torch.bfloat16, torch.float16):
        return "sdpa", f"kv attention sdpa: FlashAttention-4 runs bf16/fp16, the model is {dtype}"
    if dim < AUTO_KV_MIN_DIM:
        return (
            "sdpa",
            f"kv attention sdpa: dim {dim} < {AUTO_KV_MIN_DIM}, where FlashAttention-4 is not measured "
            "(--kv-attention fa4 forces it)",
        )
    return (
        "fa4",
        f"kv attention fa4: dim {dim} >= {AUTO_KV_MIN_DIM} on {torch.device(device)} (--kv-attention sdpa keeps SDPA)",
    )


@torch.compiler.disable
def fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, S, H*D] bf16/fp16 q, k, v -> [B, S, H*D], softmax scale 1/sqrt(D), no mask."""
    from flash_attn.cute import flash_attn_func

    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"attn_backend='fa4' runs bf16/fp16 attention, got {q.dtype}")
    b, s, hd = q.shape
    out, _ = flash_attn_func(
        q.reshape(b, s, num_heads, hd // num_heads),
        k.reshape(b, k.shape[1], num_heads, hd // num_heads),
        v.reshape(b, v.shape[1], num_heads, hd // num_heads),
    )
    return out.reshape(b, s, hd)
