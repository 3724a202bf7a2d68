"""The gc25d weight export (SPEC §6): one safetensors file of bf16 tensors, keys without ``dit.``.

Full-size: 825 Wan2.2-TI2V-5B tensors + 6 ``gc_sem_cond`` tensors = 831. String metadata:

    format=gc25d  arm=gc25d  sem_cond=gc_sem_cond  vocab=<parts|ids>  data=v10
    dit_config=<json of DiTConfig>  causal=<true|false>
    causal exports also: denoise_axis=<json list of t>  sink  window  rope_cap

plus caller ``extra`` keys (e.g. the stage-1 teacher_forcing / windowed_train / init_ckpt). The reader
checks metadata, the vocabulary (metadata vs tensor shapes), the key set and every shape against a
meta-device build of the recorded config, and that all tensors are bf16; each failure names what is
wrong. Writes are atomic.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from gc25d_core.atomic import atomic_path
from gc25d_core.models.configs import CausalConfig, DiTConfig
from gc25d_core.models.sem_cond import SEM_COND_NAME, detect_sem_hidden, detect_vocab
from gc25d_core.vocab import VOCABS, Vocab

FIXED_METADATA: dict[str, str] = {"format": "gc25d", "arm": "gc25d", "sem_cond": SEM_COND_NAME}
CAUSAL_KEYS = ("denoise_axis", "sink", "window", "rope_cap")
RESERVED_KEYS = frozenset({*FIXED_METADATA, "vocab", "data", "dit_config", "causal", *CAUSAL_KEYS})
STRIP_PREFIXES = ("dit.", "module.", "_orig_mod.")
EXPORT_DTYPE = torch.bfloat16


class ExportError(ValueError):
    """An export is malformed: metadata, vocabulary, key set, shapes or dtypes."""


class ExportMeta(BaseModel):
    """The parsed metadata of an export."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab: Vocab
    dit_config: DiTConfig
    data: str = "v10"
    causal: CausalConfig | None = None
    denoise_axis: tuple[float, ...] | None = None
    extra: dict[str, str] = {}

    def to_metadata(self) -> dict[str, str]:
        meta = dict(FIXED_METADATA)
        meta.update(
            vocab=self.vocab,
            data=self.data,
            dit_config=self.dit_config.model_dump_json(),
            causal="true" if self.causal is not None else "false",
        )
        if self.causal is not None:
            meta.update(self.causal.metadata())
            meta["denoise_axis"] = json.dumps(list(self.denoise_axis or ()))
        clash = RESERVED_KEYS & set(self.extra)
        if clash:
            raise ExportError(f"extra metadata may not override reserved keys {sorted(clash)}")
        meta.update(self.extra)
        return meta


def strip_prefix(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in STRIP_PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p) :], True
    return key


def export_state_dict(model_or_sd: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bf16, contiguous, CPU tensors; ``dit.`` / ``module.`` / ``_orig_mod.`` prefixes removed."""
    sd = model_or_sd.state_dict() if isinstance(model_or_sd, torch.nn.Module) else model_or_sd
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        name = strip_prefix(key)
        if name in out:
            raise ExportError(f"two tensors map to {name!r} after removing prefixes")
        out[name] = value.detach().to(device="cpu", dtype=EXPORT_DTYPE).contiguous()
    return out


@lru_cache(maxsize=8)
def expected_shapes(cfg: DiTConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a ``GcDiT`` built from ``cfg`` (meta device)."""
    from gc25d_core.models.configs import build_meta

    return {k: tuple(v.shape) for k, v in build_meta(cfg).state_dict().items()}


def _list(items: Sequence[str], limit: int = 8) -> str:
    items = sorted(items)
    more = f" ... (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def validate_state_dict(sd: Mapping[str, Any], cfg: DiTConfig, where: str = "export") -> None:
    """Key set, shapes and dtype (bf16) against ``cfg``; raises ``ExportError`` listing problems."""
    want = expected_shapes(cfg)
    problems: list[str] = []
    missing = set(want) - set(sd)
    unexpected = set(sd) - set(want)
    if missing:
        problems.append(f"{len(missing)} missing keys: {_list(list(missing))}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_list(list(unexpected))}")
    bad_shape = [
        f"{k} {tuple(sd[k].shape)} != {want[k]}"
        for k in sorted(set(want) & set(sd))
        if tuple(sd[k].shape) != want[k]
    ]
    if bad_shape:
        problems.append(f"{len(bad_shape)} wrong shapes: {_list(bad_shape)}")
    bad_dtype = [f"{k} {sd[k].dtype}" for k in sorted(sd) if getattr(sd[k], "dtype", None) != EXPORT_DTYPE]
    if bad_dtype:
        problems.append(f"{len(bad_dtype)} tensors not bf16: {_list(bad_dtype)}")
    if problems:
        raise ExportError(
            f"{where}: expected {len(want)} bf16 tensors of the {cfg.num_layers}-layer dim-{cfg.dim} "
            f"GcDiT ({cfg.vocab}); " + "; ".join(problems)
        )


def infer_dit_config(shapes: Mapping[str, Any], num_heads: int | None = None) -> DiTConfig:
    """DiTConfig from tensor shapes (num_heads is not in the shapes: default dim // 128, Wan's head_dim)."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in shapes:
            raise ExportError(f"cannot infer the model: no {key!r}")
        v = shapes[key]
        return tuple(v.shape) if isinstance(v, torch.Tensor) else tuple(v)

    dim, in_dim = shape("patch_embedding.weight")[:2]
    layers = {int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k))}
    patch = shape("patch_embedding.weight")[2:]
    try:
        return DiTConfig(
            dim=dim,
            in_dim=in_dim,
            out_dim=shape("head.head.weight")[0] // max(1, int(torch.tensor(patch).prod())),
            ffn_dim=shape("blocks.0.ffn.0.weight")[0],
            text_dim=shape("text_embedding.0.weight")[1],
            freq_dim=shape("time_embedding.0.weight")[1],
            num_heads=num_heads or max(1, dim // 128),
            num_layers=len(layers),
            vocab=detect_vocab(shapes),
            sem_hidden=detect_sem_hidden(shapes),
        )
    except (ValidationError, ValueError) as e:
        raise ExportError(f"cannot infer a DiTConfig from the tensor shapes: {e}") from None


def _model_config(model_or_sd: Any) -> DiTConfig | None:
    return getattr(model_or_sd, "gc_config", None) if isinstance(model_or_sd, torch.nn.Module) else None


def save_export(
    path: Path | str,
    model_or_sd: torch.nn.Module | Mapping[str, torch.Tensor],
    *,
    dit_config: DiTConfig | None = None,
    vocab: Vocab | None = None,
    causal: CausalConfig | None = None,
    denoise_axis: Sequence[float] | None = None,
    data: str = "v10",
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write the export atomically and return its path. ``causal`` and ``denoise_axis`` go together
    (causal exports record the denoise axis, sink, window and RoPE cap)."""
    from safetensors.torch import save_file

    sd = export_state_dict(model_or_sd)
    cfg = dit_config or _model_config(model_or_sd) or infer_dit_config(sd)
    detected = detect_vocab(sd)
    for name, value in (("vocab argument", vocab), ("dit_config.vocab", cfg.vocab)):
        if value is not None and value != detected:
            raise ExportError(f"{name}={value!r} but the sem-cond tensors are vocab {detected!r}")
    if (causal is None) != (denoise_axis is None):
        raise ExportError("a causal export needs both causal (sink/window/rope_cap) and denoise_axis")
    validate_state_dict(sd, cfg, where=f"export {path}")
    meta = ExportMeta(
        vocab=detected,
        dit_config=cfg,
        data=data,
        causal=causal,
        denoise_axis=None if denoise_axis is None else tuple(float(t) for t in denoise_axis),
        extra=dict(extra or {}),
    )
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(sd, str(tmp), metadata=meta.to_metadata())
    return path


def parse_metadata(
    meta: Mapping[str, str] | None, shapes: Mapping[str, Any], where: str = "export"
) -> ExportMeta:
    """Validate an export's string metadata against the fixed values and the tensor shapes."""
    if not meta:
        raise ExportError(f"{where}: no metadata (expected format=gc25d, arm=gc25d, sem_cond, vocab, data)")
    problems = [
        f"{k}={meta.get(k)!r} (expected {v!r})" for k, v in FIXED_METADATA.items() if meta.get(k) != v
    ]
    if problems:
        raise ExportError(f"{where}: not a gc25d export: " + ", ".join(problems))
    vocab = meta.get("vocab")
    if vocab not in VOCABS:
        raise ExportError(f"{where}: vocab={vocab!r} must be one of {VOCABS}")
    detected = detect_vocab(shapes)
    if detected != vocab:
        raise ExportError(
            f"{where}: metadata vocab={vocab!r} but the sem-cond tensors are vocab {detected!r}"
        )
    if "data" not in meta:
        raise ExportError(f"{where}: metadata has no 'data'")
    if "dit_config" in meta:
        try:
            cfg = DiTConfig.model_validate_json(meta["dit_config"])
        except ValidationError as e:
            raise ExportError(f"{where}: invalid dit_config metadata: {e}") from None
    else:
        cfg = infer_dit_config(shapes)
    causal_flag = meta.get("causal", "false")
    present = [k for k in CAUSAL_KEYS if k in meta]
    causal = axis = None
    if causal_flag == "true":
        if len(present) != len(CAUSAL_KEYS):
            raise ExportError(f"{where}: causal export lacks {sorted(set(CAUSAL_KEYS) - set(present))}")
        try:
            causal = CausalConfig.from_metadata(dict(meta))
            axis = tuple(float(t) for t in json.loads(meta["denoise_axis"]))
        except (ValueError, ValidationError, TypeError) as e:
            raise ExportError(f"{where}: invalid causal metadata: {e}") from None
        if not axis:
            raise ExportError(f"{where}: causal export has an empty denoise_axis")
    elif causal_flag != "false" or present:
        raise ExportError(f"{where}: causal={causal_flag!r} with causal keys {present}")
    extra = {k: v for k, v in meta.items() if k not in RESERVED_KEYS}
    return ExportMeta(
        vocab=vocab, dit_config=cfg, data=meta["data"], causal=causal, denoise_axis=axis, extra=extra
    )


def read_export(
    path: Path | str, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], ExportMeta]:
    """Load and validate an export: (state dict without prefixes, parsed metadata)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ExportError(f"export {path} does not exist")
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        meta = f.metadata()
        sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    parsed = parse_metadata(meta, sd, where=f"export {path}")
    validate_state_dict(sd, parsed.dit_config, where=f"export {path}")
    return sd, parsed
