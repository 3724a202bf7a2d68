"""FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL kernels for Hopper and Blackwell) for
the bidirectional full-sequence self-attention: ``GcDiT.attn_backend = "fa4"``.

Why: on an H200 the SFT step's GEMMs run at ~720 TFLOP/s but PyTorch SDPA's cuDNN attention at
~380 (forward + backward), 27 % of the step (docs/benchmarks.md, SFT). FA4 takes the [B, S, H, D]
layout our projections already have, so no transposes either. It is optional: the package (and its
``nvidia-cutlass-dsl`` runtime) is not a project dependency, and masked or causal attention keeps
SDPA / flex. Its kernels are compiled at run time by the CuTe DSL, outside torch.compile, so the
call is a graph break inside a compiled block.

Two ways in:
- ``"fa4"``: ``flash_attn.cute.flash_attn_func`` called directly (``fa4_attention``); a graph break.
- ``"sdpa_fa4"``: PyTorch's own FA4 hook (``torch.nn.attention.activate_flash_attention_impl("FA4")``,
  a prototype in torch >= 2.10) puts the same kernels behind SDPA's flash op, and the call asks SDPA
  for its flash backend (``fa4_sdpa_attention``). The aten op is opaque to torch.compile, so a
  compiled block stays one graph. Activation is process-wide: every SDPA flash call then runs FA4.

The package's top-level module is ``flash_attn``, the name DiffSynth probes for FlashAttention-2;
with flash-attn-4 installed, DiffSynth's own Wan attention takes its FA2 branch and fails. GcDiT
never calls it, but keep the package out of environments that run plain DiffSynth models
(bench/h200_pending.sh gives it a folder of its own).
"""

from __future__ import annotations

import importlib.util

import torch


def fa4_available() -> bool:
    """The package is importable (the GPU still has to be sm90 or newer)."""
    return importlib.util.find_spec("flash_attn") is not None and (
        importlib.util.find_spec("flash_attn.cute") is not None
    )


def check_fa4(device: torch.device | str) -> None:
    """Raise, saying what is missing, unless FA4 can run on ``device``."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError(f"attn_backend='fa4' / 'sdpa_fa4' needs a CUDA device, got {device}")
    if torch.cuda.get_device_capability(device)[0] < 9:
        raise RuntimeError(
            f"attn_backend='fa4' needs sm90 or newer, {device} is {torch.cuda.get_device_name(device)}"
        )
    if not fa4_available():
        raise RuntimeError("attn_backend='fa4' needs the flash-attn-4 package (flash_attn.cute)")


def activate_fa4_sdpa() -> None:
    """Route SDPA's flash kernel to FA4 for this process (idempotent); raises if torch lacks the hook."""
    from torch.nn import attention

    if not hasattr(attention, "activate_flash_attention_impl"):
        raise RuntimeError(
            f"attn_backend='sdpa_fa4' needs torch.nn.attention.activate_flash_attention_impl "
            f"(torch >= 2.10), this is torch {torch.__version__}"
        )
    current = getattr(attention, "current_flash_attention_impl", lambda: None)()
    if current != "FA4":
        attention.activate_flash_attention_impl("FA4")


def fa4_sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, S, H*D] -> [B, S, H*D] through SDPA's flash backend (FA4 once ``activate_fa4_sdpa`` ran).
    The head transposes are views: FA4 reads the [B, S, H, D] memory as it is."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, s, hd = q.shape
    q4, k4, v4 = (x.view(b, x.shape[1], num_heads, hd // num_heads).transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q4, k4, v4)
    return out.transpose(1, 2).reshape(b, s, hd)


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
