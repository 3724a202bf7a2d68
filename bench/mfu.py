"""The MFU convention of the benches here (plain_zero2.py's, research/h200_baseline.md): model
FLOPs of the DiT blocks only, 2·P·s for the matmuls plus 4·L·s²·d self-attention and 4·L·s·T·d
cross-attention per forward, ×3 for forward + backward, against the H200's dense bf16 989 TFLOP/s."""

from __future__ import annotations

PEAK_TFLOPS = 989.0


def dit_flops(
    block_params: int, tokens: int, dim: int, layers: int, text_len: int, train: bool = True
) -> float:
    """FLOPs of one clip of ``tokens`` tokens through the blocks (``train``: forward + backward)."""
    f = 2 * block_params * tokens + 4 * layers * tokens**2 * dim + 4 * layers * tokens * text_len * dim
    return 3 * f if train else f


def mfu(flops: float, seconds: float) -> float:
    """Fraction of the peak that ``flops`` in ``seconds`` is."""
    return flops / seconds / (PEAK_TFLOPS * 1e12)


def forward_flops(
    block_params: int, tokens: int, dim: int, layers: int, text_len: int, attn_pairs: float | None = None
) -> float:
    """One forward of ``tokens`` tokens through the blocks, counting ``attn_pairs`` query-key pairs of
    self-attention (default tokens², unmasked): 2·P·s + 4·L·pairs·d + 4·L·s·T·d. A masked attention
    counts only the pairs its mask allows (what a block-sparse kernel needs to do)."""
    pairs = tokens**2 if attn_pairs is None else attn_pairs
    return 2 * block_params * tokens + 4 * layers * pairs * dim + 4 * layers * tokens * text_len * dim
