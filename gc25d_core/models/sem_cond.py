"""The numeric semantic condition ``gc_sem_cond`` (SPEC §3, §6; DESIGN.md §4.2).

Per-pixel raw ids (uint8, "parts" or "ids" vocabulary) never go through the VAE. They become, per
8x8-pixel pool, the fraction of each of the K classes (``pooled_onehot``). One DiT token covers one
latent cell (4 frames) x 32x32 pixels = 4 frames x 4x4 pools, so its input is 64*K numbers (1280 for
"parts"). ``SemCondEncoder`` maps them 64*K -> 512 -> 512 -> dim with a zero-initialised last layer
and its output ``[B, dim, cells, H/32, W/32]`` is added to the patch-embedding output, so a fresh
encoder leaves the pretrained Wan model unchanged. Cell 0 is one frame (the TI2V anchor); it is
replicated x4 in time so every cell has 4 frames.

Layers: ``proj_in`` Conv3d(K, hidden, kernel=stride=(4,4,4)) over the pooled grid (equivalent to a
linear layer on the 64*K token vector), SiLU, ``proj_mid`` 1x1x1 Conv3d, SiLU, ``proj_out`` 1x1x1
Conv3d to ``dim``, zero-initialised: 6 tensors. The vocabulary is read back from
``proj_in.weight``'s shape [hidden, K, 4, 4, 4].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gc25d_core.vocab import VOCABS, Vocab, num_classes, raw_to_class_map

SEM_COND_NAME = "gc_sem_cond"
PIXELS_PER_POOL = 8
POOLS_PER_TOKEN = 4  # per side: a token is 32x32 pixels
FRAMES_PER_CELL = 4
PIXELS_PER_TOKEN = PIXELS_PER_POOL * POOLS_PER_TOKEN
SEM_COND_PARAMS = (
    "proj_in.weight",
    "proj_in.bias",
    "proj_mid.weight",
    "proj_mid.bias",
    "proj_out.weight",
    "proj_out.bias",
)


def sem_cond_keys(prefix: str = SEM_COND_NAME) -> tuple[str, ...]:
    """The 6 state-dict keys of the encoder under ``prefix``."""
    return tuple(f"{prefix}.{p}" for p in SEM_COND_PARAMS)


_LUT_CACHE: dict[tuple[str, str], torch.Tensor] = {}


def class_lut(vocab: Vocab, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [256]: raw value -> class index, -1 where ``vocab`` has no such value."""
    key = (vocab, str(device))
    if key not in _LUT_CACHE:
        lut = torch.full((256,), -1, dtype=torch.int64)
        for raw, cls in raw_to_class_map(vocab).items():
            lut[raw] = cls
        _LUT_CACHE[key] = lut.to(device)
    return _LUT_CACHE[key]


def pooled_onehot(ids: torch.Tensor, vocab: Vocab = "parts", *, check: bool = True) -> torch.Tensor:
    """Raw ids ``[F, H, W]`` or ``[B, F, H, W]`` (integer) -> float32 ``[B, K, F, H/8, W/8]``: the
    fraction of each class in each 8x8 pool (sums to 1 over K). ``check`` raises on raw values
    outside ``vocab``, naming them (one device sync); with ``check=False`` they count as UNKNOWN."""
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor of raw values, got {ids.dtype}")
    if ids.ndim == 3:
        ids = ids.unsqueeze(0)
    if ids.ndim != 4:
        raise ValueError(f"ids must be [F,H,W] or [B,F,H,W], got shape {tuple(ids.shape)}")
    b, f, h, w = ids.shape
    p = PIXELS_PER_POOL
    if h % p or w % p:
        raise ValueError(f"ids H, W = {h}, {w} must be multiples of {p}")
    k_total = num_classes(vocab)
    raw = ids.long()
    cls = class_lut(vocab, ids.device)[raw.clamp(0, 255)]
    invalid = (cls < 0) | (raw != raw.clamp(0, 255))
    if check and bool(invalid.any()):
        bad = sorted(int(v) for v in torch.unique(raw[invalid]).tolist())
        raise ValueError(f"ids: values {bad} are outside vocab {vocab!r}")
    cls = cls.masked_fill_(invalid, k_total - 1)  # UNKNOWN is the last class
    hp, wp = h // p, w // p
    # one scatter pass: pool pixels -> [B, F, Hp, Wp, 64] class indices -> per-class counts
    pooled_idx = cls.view(b, f, hp, p, wp, p).permute(0, 1, 2, 4, 3, 5).reshape(b, f, hp, wp, p * p)
    counts = torch.zeros(b, f, hp, wp, k_total, dtype=torch.float32, device=ids.device)
    counts.scatter_add_(
        -1, pooled_idx, torch.ones((), dtype=torch.float32, device=ids.device).expand(pooled_idx.shape)
    )
    return counts.mul_(1.0 / (p * p)).permute(0, 4, 1, 2, 3).contiguous()


def num_cells_for_frames(num_frames: int, first_cell: int = 0) -> int:
    """Frames -> cells: from cell 0 the first frame is a cell of its own, then groups of 4."""
    if first_cell == 0:
        if num_frames < 1 or (num_frames - 1) % FRAMES_PER_CELL:
            raise ValueError(f"{num_frames} frames starting at cell 0: expected 1 + 4k")
        return 1 + (num_frames - 1) // FRAMES_PER_CELL
    if num_frames < 1 or num_frames % FRAMES_PER_CELL:
        raise ValueError(f"{num_frames} frames starting at cell {first_cell}: expected a multiple of 4")
    return num_frames // FRAMES_PER_CELL


def cell_frame_slice(cell: int) -> slice:
    """Clip-relative frames of latent cell ``cell`` (cell 0 = frame 0; cell j = 4j-3 .. 4j)."""
    if cell < 0:
        raise ValueError(f"cell must be >= 0, got {cell}")
    if cell == 0:
        return slice(0, 1)
    return slice(FRAMES_PER_CELL * cell - (FRAMES_PER_CELL - 1), FRAMES_PER_CELL * cell + 1)


def cells_frame_slice(cells: range) -> slice:
    """Clip-relative frames of the consecutive latent ``cells`` (``cell_frame_slice`` of each, joined)."""
    return slice(cell_frame_slice(cells[0]).start, cell_frame_slice(cells[-1]).stop)


def frames_to_cell_time(x_BKFHW: torch.Tensor, first_cell: int = 0) -> torch.Tensor:
    """Make every cell 4 frames long along dim 2: from cell 0, frame 0 is replicated x4."""
    num_cells_for_frames(x_BKFHW.shape[2], first_cell)
    if first_cell != 0:
        return x_BKFHW
    anchor = x_BKFHW[:, :, :1].expand(-1, -1, FRAMES_PER_CELL, -1, -1)
    return torch.cat([anchor, x_BKFHW[:, :, 1:]], dim=2)


class SemCondEncoder(nn.Module):
    """Pooled one-hot (64*K per token) -> hidden -> hidden -> zero-initialised ``dim``."""

    def __init__(self, vocab: Vocab = "parts", dim: int = 3072, hidden: int = 512):
        super().__init__()
        if vocab not in VOCABS:
            raise ValueError(f"unknown vocab {vocab!r}; expected one of {VOCABS}")
        self.vocab: Vocab = vocab
        self.num_classes = num_classes(vocab)
        kernel = (FRAMES_PER_CELL, POOLS_PER_TOKEN, POOLS_PER_TOKEN)
        self.proj_in = nn.Conv3d(self.num_classes, hidden, kernel_size=kernel, stride=kernel)
        self.proj_mid = nn.Conv3d(hidden, hidden, kernel_size=1)
        self.proj_out = nn.Conv3d(hidden, dim, kernel_size=1)
        self.act = nn.SiLU()
        self.zero_last_layer()

    def zero_last_layer(self) -> None:
        if self.proj_out.weight.device.type == "meta":
            return
        with torch.no_grad():
            self.proj_out.weight.zero_()
            if self.proj_out.bias is not None:
                self.proj_out.bias.zero_()

    def forward(
        self,
        ids: torch.Tensor | None = None,
        *,
        pooled: torch.Tensor | None = None,
        first_cell: int = 0,
        check: bool = True,
    ) -> torch.Tensor:
        """``ids`` [B,F,H,W] raw (or ``pooled`` [B,K,F,H/8,W/8]) covering cells ``first_cell``.. ->
        ``[B, dim, cells, H/32, W/32]`` in the encoder's dtype."""
        if pooled is None:
            if ids is None:
                raise ValueError("SemCondEncoder needs ids or pooled")
            pooled = pooled_onehot(ids, self.vocab, check=check)
        if pooled.shape[1] != self.num_classes:
            raise ValueError(
                f"pooled has {pooled.shape[1]} classes, vocab {self.vocab!r} has {self.num_classes}"
            )
        hp, wp = pooled.shape[-2:]
        if hp % POOLS_PER_TOKEN or wp % POOLS_PER_TOKEN:
            raise ValueError(f"pooled grid {hp}x{wp} must be a multiple of {POOLS_PER_TOKEN} (pixels of 32)")
        x = frames_to_cell_time(pooled, first_cell).to(self.proj_in.weight.dtype)
        x = self.act(self.proj_in(x))
        x = self.act(self.proj_mid(x))
        return self.proj_out(x)


def install_sem_cond(dit: Any, vocab: Vocab = "parts", hidden: int = 512) -> SemCondEncoder:
    """Attach a fresh ``gc_sem_cond`` (zero last layer) to ``dit``, on its device and dtype."""
    ref = dit.patch_embedding.weight
    enc = SemCondEncoder(vocab, dim=ref.shape[0], hidden=hidden)
    if ref.device.type != "meta":
        enc = enc.to(device=ref.device, dtype=ref.dtype)
    else:
        enc = enc.to_empty(device="meta")
    setattr(dit, SEM_COND_NAME, enc)
    return enc


def _shape(v: object) -> tuple[int, ...]:
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, Sequence):
        return tuple(int(x) for x in v)
    raise TypeError(f"expected a tensor or a shape, got {type(v).__name__}")


def find_sem_cond_prefix(shapes: Mapping[str, object]) -> str | None:
    """The prefix under which the encoder's keys sit (``gc_sem_cond`` or ``dit.gc_sem_cond``...)."""
    suffix = f"{SEM_COND_NAME}.proj_in.weight"
    hits = [k[: -len(".proj_in.weight")] for k in shapes if k == suffix or k.endswith("." + suffix)]
    if len(hits) > 1:
        raise ValueError(f"several sem-cond encoders in one state dict: {hits}")
    return hits[0] if hits else None


def detect_vocab(shapes: Mapping[str, object]) -> Vocab:
    """Vocabulary of a checkpoint from its tensor shapes (``proj_in.weight`` [hidden, K, 4, 4, 4])."""
    prefix = find_sem_cond_prefix(shapes)
    if prefix is None:
        raise ValueError(f"no '{SEM_COND_NAME}.proj_in.weight' in the state dict: not a gc25d checkpoint")
    shape = _shape(shapes[f"{prefix}.proj_in.weight"])
    kernel = (FRAMES_PER_CELL, POOLS_PER_TOKEN, POOLS_PER_TOKEN)
    if len(shape) != 5 or shape[2:] != kernel:
        raise ValueError(f"{prefix}.proj_in.weight has shape {shape}, expected [hidden, K, 4, 4, 4]")
    by_k = {num_classes(v): v for v in VOCABS}
    if shape[1] not in by_k:
        raise ValueError(
            f"{prefix}.proj_in.weight has K={shape[1]} classes; known vocabularies: "
            + ", ".join(f"{v} (K={num_classes(v)})" for v in VOCABS)
        )
    return by_k[shape[1]]


def detect_sem_hidden(shapes: Mapping[str, object]) -> int:
    prefix = find_sem_cond_prefix(shapes)
    if prefix is None:
        raise ValueError(f"no '{SEM_COND_NAME}' keys in the state dict")
    return _shape(shapes[f"{prefix}.proj_in.weight"])[0]
