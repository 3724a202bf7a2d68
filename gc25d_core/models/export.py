"""The gc25d weight export (SPEC §6): one safetensors file of bf16 tensors, keys without ``dit.``.

Full-size: 825 Wan2.2-TI2V-5B tensors + 6 ``gc_sem_cond`` tensors = 831. String metadata:

    format=gc25d  arm=gc25d  sem_cond=gc_sem_cond  vocab=<parts|ids>  data=v10
    dit_config=<json of DiTConfig>  causal=<true|false>
    causal exports also: denoise_axis=<json list of t>  sink  window  rope_cap

plus caller ``extra`` keys (e.g. the stage-1 teacher_forcing / windowed_train / init_ckpt). The reader
checks, in this order and before any tensor is loaded: the file's SHA256 (when the caller knows it),
that the file is a readable safetensors file, the metadata, the recorded config against the tensors
the header lists (layer count and the dims the shapes show, within ``MAX_LAYERS``: a config is never
built from metadata alone), then the key set and every shape against a meta-device build of that
config and that all tensors are bf16. Each failure is an ``ExportError`` naming the file and what is
wrong. Writes are atomic.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from gc25d_core.models.configs import CausalConfig, DiTConfig
from gc25d_core.models.sem_cond import SEM_COND_NAME, detect_sem_hidden, detect_vocab
from gc25d_core.vocab import VOCABS, Vocab

FIXED_METADATA: dict[str, str] = {"format": "gc25d", "arm": "gc25d", "sem_cond": SEM_COND_NAME}
CAUSAL_KEYS = ("denoise_axis", "sink", "window", "rope_cap")
RESERVED_KEYS = frozenset({*FIXED_METADATA, "vocab", "data", "dit_config", "causal", *CAUSAL_KEYS})
STRIP_PREFIXES = ("dit.", "module.", "_orig_mod.")
EXPORT_DTYPE = torch.bfloat16
MAX_LAYERS = 1024
"""More transformer blocks than any export may hold (Wan2.2-TI2V-5B has 30): a bound on what a
header can make the reader build."""
MAX_JSON_METADATA = 1 << 16
"""Characters of a JSON metadata value (dit_config, denoise_axis) the reader parses at most."""
MAX_CELLS = 1024
"""Bound of a causal export's sink / window / RoPE cap (cells; the KV cache a session allocates
follows the window) and of its denoise axis's length."""
# safetensors' dtype names -> torch's (the ones an export or a foreign file may carry)
_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class ExportError(ValueError):
    """An export is malformed: metadata, vocabulary, key set, shapes or dtypes."""


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the file's header lists it: what the checks need, nothing loaded."""

    shape: torch.Size
    dtype: torch.dtype | str  # the safetensors name where torch has no such dtype


class ExportHeader(NamedTuple):
    metadata: dict[str, str] | None
    tensors: dict[str, TensorSpec]


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
    from gc25d_core.models.safetensors_file import save_safetensors

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
    return save_safetensors(sd, path, meta.to_metadata())


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
    try:
        detected = detect_vocab(shapes)
    except ValueError as e:
        raise ExportError(f"{where}: {e}") from None
    if detected != vocab:
        raise ExportError(
            f"{where}: metadata vocab={vocab!r} but the sem-cond tensors are vocab {detected!r}"
        )
    if "data" not in meta:
        raise ExportError(f"{where}: metadata has no 'data'")
    for key in ("dit_config", "denoise_axis"):
        if len(meta.get(key, "")) > MAX_JSON_METADATA:
            raise ExportError(
                f"{where}: {key} metadata of {len(meta[key])} characters (at most {MAX_JSON_METADATA})"
            )
    if "dit_config" in meta:
        try:
            cfg = DiTConfig.model_validate_json(meta["dit_config"])
        except ValidationError as e:
            raise ExportError(f"{where}: invalid dit_config metadata: {e}") from None
    else:
        cfg = infer_dit_config(shapes)
    check_config_against_tensors(cfg, shapes, where)
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
        bounds = [f"{k}={v}" for k, v in causal.model_dump().items() if v is not None and v > MAX_CELLS]
        if len(axis) > MAX_CELLS:
            bounds.append(f"a denoise_axis of {len(axis)} steps")
        if not all(math.isfinite(t) for t in axis):
            bounds.append("a denoise_axis with non-finite timesteps")
        if bounds:
            raise ExportError(
                f"{where}: causal metadata out of bounds (at most {MAX_CELLS}): {', '.join(bounds)}"
            )
    elif causal_flag != "false" or present:
        raise ExportError(f"{where}: causal={causal_flag!r} with causal keys {present}")
    extra = {k: v for k, v in meta.items() if k not in RESERVED_KEYS}
    return ExportMeta(
        vocab=vocab, dit_config=cfg, data=meta["data"], causal=causal, denoise_axis=axis, extra=extra
    )


def check_config_against_tensors(cfg: DiTConfig, shapes: Mapping[str, Any], where: str = "export") -> None:
    """The recorded config must describe the tensors the file holds: its layer count that of the
    ``blocks.N`` indices present (at most ``MAX_LAYERS``), its dims those the shapes show. Checked
    before anything is built from ``cfg``, so that a header claiming a huge model cannot make the
    reader allocate for it; the key set and every shape are checked after (``validate_state_dict``)."""

    def shape(key: str) -> tuple[int, ...] | None:
        v = shapes.get(key)
        if v is None:
            return None
        return tuple(v.shape) if hasattr(v, "shape") else tuple(v)

    layers = {int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k))}
    problems: list[str] = []
    if len(layers) > MAX_LAYERS:
        problems.append(f"{len(layers)} transformer blocks (at most {MAX_LAYERS})")
    if cfg.num_layers != len(layers):
        problems.append(f"num_layers={cfg.num_layers} but the tensors hold {len(layers)} blocks")
    patch = 1
    for p in cfg.patch_size:
        patch *= p
    seen = {  # config field -> (key, index into its shape, divisor)
        "dim": ("patch_embedding.weight", 0, 1),
        "in_dim": ("patch_embedding.weight", 1, 1),
        "out_dim": ("head.head.weight", 0, patch),
        "ffn_dim": ("blocks.0.ffn.0.weight", 0, 1),
        "text_dim": ("text_embedding.0.weight", 1, 1),
        "freq_dim": ("time_embedding.0.weight", 1, 1),
        "sem_hidden": (f"{SEM_COND_NAME}.proj_in.weight", 0, 1),
    }
    for name, (key, i, div) in seen.items():
        s = shape(key)
        if s is not None and len(s) > i and getattr(cfg, name) != s[i] // div:
            problems.append(f"{name}={getattr(cfg, name)} but {key} has shape {list(s)}")
    if problems:
        raise ExportError(
            f"{where}: the dit_config metadata does not describe the tensors: " + "; ".join(problems)
        )


def read_header(path: Path | str, expected_sha256: str | None = None) -> ExportHeader:
    """The metadata and the tensors' shapes and dtypes of a safetensors file, no tensor loaded. With
    ``expected_sha256`` the file's bytes are checked first: nothing of a file that is not the one
    asked for is parsed. Any failure is an ``ExportError`` naming the file."""
    from safetensors import SafetensorError, safe_open

    from gc25d_core.hashing import sha256_file

    path = Path(path)
    if not path.is_file():
        raise ExportError(f"export {path} does not exist" + (" (not a file)" if path.exists() else ""))
    if expected_sha256 is not None:
        got = sha256_file(path)
        if got != expected_sha256.lower():
            raise ExportError(f"export {path}: sha256 {got} != expected {expected_sha256}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata()
            tensors: dict[str, TensorSpec] = {}
            for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                sl = f.get_slice(k)
                name = sl.get_dtype()
                tensors[k] = TensorSpec(torch.Size(sl.get_shape()), _DTYPES.get(name, name))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ExportError(f"export {path}: not a readable safetensors file ({e})") from None
    return ExportHeader(dict(meta) if meta is not None else None, tensors)


def read_export_meta(path: Path | str, expected_sha256: str | None = None) -> ExportMeta:
    """An export's parsed and checked metadata, from its header only (no tensor loaded)."""
    header = read_header(path, expected_sha256)
    where = f"export {path}"
    shapes = {k: t.shape for k, t in header.tensors.items()}
    parsed = parse_metadata(header.metadata, shapes, where=where)
    validate_state_dict(header.tensors, parsed.dit_config, where=where)
    return parsed


def read_export(
    path: Path | str, device: str | torch.device = "cpu", expected_sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], ExportMeta]:
    """Load and validate an export: (state dict without prefixes, parsed metadata). The SHA256 (if
    given), the header and the metadata are checked before any tensor is read."""
    from safetensors import SafetensorError, safe_open

    parsed = read_export_meta(path, expected_sha256)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ExportError(f"export {path}: tensors cannot be read ({e})") from None
    return sd, parsed


def deployed_from(path: Path | str, expected_sha256: str | None = None) -> str | None:
    """The SHA256 of the export a deploy export was copied from (its ``deploy_source``), from the
    header only (after the file's own hash, when given); None for any other export."""
    raw = (read_header(path, expected_sha256).metadata or {}).get("deploy_source")
    if raw is None:
        return None
    try:
        sha = json.loads(raw).get("sha256")
    except (ValueError, AttributeError):
        raise ExportError(f"{path}: deploy_source metadata is not a JSON object: {raw!r}") from None
    return sha if isinstance(sha, str) else None
