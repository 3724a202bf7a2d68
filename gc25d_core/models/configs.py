"""Model configurations: the Wan2.2-TI2V-5B DiT + gc_sem_cond (full and tiny) and causal attention.

``DiTConfig`` holds the WanModel dimensions plus the semantic-condition settings; ``wan_kwargs()``
gives the WanModel constructor arguments with the TI2V flags of DiffSynth's registry entry
(hash ``WAN22_TI2V_5B_HASH``). The full config builds on the meta device in well under a second
(``build_meta``), which is how key sets and shapes are checked without weights.

``CausalConfig`` is DESIGN.md §4.4: block = 1 cell; sink = cells 0..sink-1; window = the current
cell and the ``window - 1`` cells before it; RoPE time positions absolute up to ``rope_cap`` and,
beyond it, shifted so the current cell sits at ``rope_cap`` (sink cells keep 0..sink-1).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from gc25d_core.vocab import VOCABS, Vocab

WAN22_TI2V_5B_HASH = "1f5ab7703c6fc803fdded85ff040c316"
NUM_WAN_KEYS_5B = 825
NUM_SEM_COND_KEYS = 6
PATCH_SIZE = (1, 2, 2)
RUNTIME_FIELDS = ("per_cell_time", "fused_rmsnorm")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def rope_head_dim_ok(head_dim: int) -> bool:
    """DiffSynth's 3-D RoPE splits head_dim into hd - 2*(hd//3) (time) and hd//3 (h, w); each part
    must be even (research/diffsynth_wan22.md §2: 12/24/48/96/128 work, 64 does not)."""
    third = head_dim // 3
    return head_dim > 0 and third > 0 and third % 2 == 0 and (head_dim - 2 * third) % 2 == 0


class DiTConfig(_Frozen):
    """Wan2.2-TI2V-5B dimensions (defaults) + gc_sem_cond, and two runtime switches that change no
    weights: ``per_cell_time`` computes the time embedding once per cell instead of once per token,
    ``fused_rmsnorm`` runs the q/k RMSNorms as one ``F.rms_norm`` kernel (same values up to rounding;
    measured +10 % training throughput on an H200). With both off the forward is bit-identical to
    DiffSynth's ``model_fn_wan_video``."""

    dim: int = 3072
    in_dim: int = 48
    out_dim: int = 48
    ffn_dim: int = 14336
    text_dim: int = 4096
    freq_dim: int = 256
    num_heads: int = 24
    num_layers: int = 30
    eps: float = 1e-6
    patch_size: tuple[int, int, int] = PATCH_SIZE
    vocab: Vocab = "parts"
    sem_hidden: int = 512
    per_cell_time: bool = False
    fused_rmsnorm: bool = False

    @model_validator(mode="after")
    def _check(self) -> DiTConfig:
        if self.dim % self.num_heads:
            raise ValueError(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        if not rope_head_dim_ok(self.head_dim):
            raise ValueError(
                f"head_dim={self.head_dim} (dim/num_heads) does not split into even 3-D RoPE parts; "
                "use e.g. 12, 24, 48, 96 or 128"
            )
        if tuple(self.patch_size) != PATCH_SIZE:
            raise ValueError(
                f"patch_size must be {PATCH_SIZE}: gc_sem_cond maps 4 frames x 32x32 px per token"
            )
        if self.vocab not in VOCABS:
            raise ValueError(f"vocab={self.vocab!r} must be one of {VOCABS}")
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def architecture(self) -> dict[str, Any]:
        """The fields that shape the weights (runtime switches excluded)."""
        return self.model_dump(exclude=set(RUNTIME_FIELDS))

    def wan_kwargs(self) -> dict[str, Any]:
        """Constructor kwargs for DiffSynth ``WanModel`` (TI2V: fused first frame, per-token t)."""
        return {
            "has_image_input": False,
            "patch_size": list(self.patch_size),
            "in_dim": self.in_dim,
            "dim": self.dim,
            "ffn_dim": self.ffn_dim,
            "freq_dim": self.freq_dim,
            "text_dim": self.text_dim,
            "out_dim": self.out_dim,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "eps": self.eps,
            "seperated_timestep": True,
            "require_clip_embedding": False,
            "require_vae_embedding": False,
            "fuse_vae_embedding_in_latents": True,
        }


def full_config(vocab: Vocab = "parts", **overrides: Any) -> DiTConfig:
    """The production model: Wan2.2-TI2V-5B + gc_sem_cond (in 64*K -> 512 -> 512 -> 3072)."""
    return DiTConfig(vocab=vocab, **overrides)


def tiny_config(vocab: Vocab = "parts", **overrides: Any) -> DiTConfig:
    """A few-hundred-k-parameter model of the same classes for CPU tests (fp32)."""
    base: dict[str, Any] = dict(
        dim=96, ffn_dim=256, num_heads=2, num_layers=2, text_dim=64, freq_dim=32, sem_hidden=64
    )
    base.update(overrides)
    return DiTConfig(vocab=vocab, **base)


def registry_wan_kwargs() -> dict[str, Any]:
    """The 5B entry of DiffSynth's model registry (looked up by key hash)."""
    from gc25d_core.compat import import_diffsynth

    import_diffsynth()
    from diffsynth.configs.model_configs import MODEL_CONFIGS

    for entry in MODEL_CONFIGS:
        if entry.get("model_hash") == WAN22_TI2V_5B_HASH:
            return dict(entry["extra_kwargs"])
    raise LookupError(f"DiffSynth's registry has no entry with hash {WAN22_TI2V_5B_HASH}")


class CausalConfig(_Frozen):
    """Block-causal attention with block = 1 cell (DESIGN.md §4.4).

    A query in cell i sees key cell j <= i iff ``j < sink`` or ``j > i - window`` (window counts the
    current cell); ``window=None`` is plain block-causal (sink unused). RoPE time position of key
    cell j for query cell i: ``j`` if ``j < sink`` else ``j - max(0, i - rope_cap)``; the query cell
    gets ``min(i, rope_cap)``. Up to cell ``rope_cap`` this is the absolute position, so full-sequence
    training (21 cells, cap 20) and the KV-cache rollout agree exactly; beyond it the window slides
    under a fixed position range 0..rope_cap. Requires ``rope_cap >= sink + window - 1`` so shifted
    window positions never reach the sink's.
    """

    sink: int = 3
    window: int | None = 17
    rope_cap: int | None = 20

    @model_validator(mode="after")
    def _check(self) -> CausalConfig:
        if self.sink < 0:
            raise ValueError(f"sink={self.sink} must be >= 0")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window={self.window} must be >= 1 (it counts the current cell) or None")
        if self.rope_cap is not None:
            if self.window is None:
                raise ValueError("rope_cap needs a window: without eviction shifted positions would collide")
            if self.rope_cap < self.sink + self.window - 1:
                raise ValueError(
                    f"rope_cap={self.rope_cap} must be >= sink + window - 1 = {self.sink + self.window - 1}"
                )
        return self

    @property
    def windowed(self) -> bool:
        return self.window is not None

    def metadata(self) -> dict[str, str]:
        """String metadata for checkpoints/exports (``none`` = not set)."""
        return {
            "sink": str(self.sink),
            "window": "none" if self.window is None else str(self.window),
            "rope_cap": "none" if self.rope_cap is None else str(self.rope_cap),
        }

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> CausalConfig:
        def _opt(v: str) -> int | None:
            return None if v == "none" else int(v)

        return cls(sink=int(meta["sink"]), window=_opt(meta["window"]), rope_cap=_opt(meta["rope_cap"]))


DEPLOY_CAUSAL = CausalConfig()
"""Stage 3 + deploy: sink 3, window 17, RoPE cap 20."""

FULL_CAUSAL = CausalConfig(sink=0, window=None, rope_cap=None)
"""Stage 1 'windowed 0/0': plain block-causal attention over the whole clip."""


def build_gcdit(cfg: DiTConfig, device: Any = None, dtype: Any = None):
    """Build a randomly initialised ``GcDiT`` (sem-cond last layer zero) on ``device``."""
    import torch

    from gc25d_core.models.gcdit import GcDiT

    with torch.device(device or "cpu"):
        model = GcDiT.from_config(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model


def build_meta(cfg: DiTConfig | None = None):
    """``GcDiT`` on the meta device (no memory, ~0.2 s for the 5B): for key/shape checks."""
    return build_gcdit(cfg or full_config(), device="meta")
