"""Loading weights, verified before use (DESIGN.md §4.6).

* Wan2.2-TI2V-5B: the fp32 safetensors shards (3 in the release) are checked against configured
  sha256 digests, then their key+shape hash (read from the headers, no tensor loaded) against
  DiffSynth's registry hash, then loaded as bf16. Into a GcDiT only the 6 sem-cond keys may be
  missing; they keep their fresh (zero last layer) initialisation.
* Our exports: ``load_gc_weights`` reads an export (``export.read_export`` validates metadata, keys,
  shapes), optionally sha256-checked, and builds or fills a GcDiT; the vocabulary comes from the
  tensor shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from gc25d_core.hashing import sha256_file
from gc25d_core.models.configs import WAN22_TI2V_5B_HASH, DiTConfig, full_config
from gc25d_core.models.export import ExportMeta, read_export
from gc25d_core.models.sem_cond import SEM_COND_NAME, SemCondEncoder, sem_cond_keys
from gc25d_core.vocab import Vocab

SHARD_INDEX = "diffusion_pytorch_model.safetensors.index.json"
SHARD_GLOB = "diffusion_pytorch_model*.safetensors"


class WeightsError(ValueError):
    """Weights failed verification: missing file, digest mismatch, wrong key set."""


def verify_sha256(paths: Iterable[Path | str], expected: Mapping[str, str]) -> None:
    """Every file must have an entry (by file name) in ``expected`` and match it."""
    problems: list[str] = []
    for p in map(Path, paths):
        if not p.is_file():
            problems.append(f"{p}: missing")
            continue
        want = expected.get(p.name)
        if want is None:
            problems.append(f"{p.name}: no expected sha256 configured")
            continue
        got = sha256_file(p)
        if got != want.lower():
            problems.append(f"{p}: sha256 {got} != expected {want}")
    if problems:
        raise WeightsError("weights failed sha256 verification: " + "; ".join(problems))


def wan_shard_paths(model_dir: Path | str) -> list[Path]:
    """The DiT shards of a Wan2.2-TI2V-5B folder (from the index json when present)."""
    model_dir = Path(model_dir)
    index = model_dir / SHARD_INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        paths = [model_dir / n for n in names]
    else:
        paths = sorted(model_dir.glob(SHARD_GLOB))
    if not paths:
        raise WeightsError(f"{model_dir}: no {SHARD_GLOB} shards")
    return paths


def key_hash_of_files(paths: Iterable[Path | str]) -> str:
    """DiffSynth's key+shape hash of safetensors files, from their headers only."""
    from gc25d_core.compat import import_diffsynth

    import_diffsynth()
    from diffsynth.core.loader.file import hash_model_file

    return hash_model_file([str(p) for p in paths])


def load_wan_state_dict(
    paths: Iterable[Path | str],
    *,
    expected_sha256: Mapping[str, str],
    expected_key_hash: str = WAN22_TI2V_5B_HASH,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, torch.Tensor]:
    """sha256 check -> registry key-hash check -> tensors cast to ``dtype``."""
    from safetensors import safe_open

    files = [Path(p) for p in paths]
    verify_sha256(files, expected_sha256)
    got = key_hash_of_files(files)
    if got != expected_key_hash:
        raise WeightsError(
            f"key hash of {[p.name for p in files]} is {got}, expected {expected_key_hash} "
            "(not the Wan2.2-TI2V-5B DiT, or an incomplete shard set)"
        )
    sd: dict[str, torch.Tensor] = {}
    for p in files:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if k in sd:
                    raise WeightsError(f"{k!r} appears in more than one shard")
                sd[k] = f.get_tensor(k).to(dtype)
    return sd


def check_wan_keys(model_keys: Iterable[str], sd_keys: Iterable[str]) -> None:
    """Only the sem-cond keys may be missing from a Wan state dict; nothing may be extra."""
    model_keys, sd_keys = set(model_keys), set(sd_keys)
    missing = model_keys - sd_keys - set(sem_cond_keys())
    unexpected = sd_keys - model_keys
    if missing or unexpected:
        raise WeightsError(
            f"Wan weights do not fit GcDiT: missing {sorted(missing)[:8]} ({len(missing)}), "
            f"unexpected {sorted(unexpected)[:8]} ({len(unexpected)})"
        )


def load_wan_into(model: torch.nn.Module, sd: Mapping[str, torch.Tensor]) -> None:
    """Copy Wan weights into an existing GcDiT (its sem-cond encoder is left as is)."""
    check_wan_keys(model.state_dict().keys(), sd.keys())
    model.load_state_dict(dict(sd), strict=False)


def _materialize(cfg: DiTConfig, sd: dict[str, torch.Tensor], device: Any, dtype: torch.dtype | None):
    from gc25d_core.models.gcdit import GcDiT

    with torch.device("meta"):
        model = GcDiT(cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    model.host_freqs()  # the RoPE table is no parameter: off meta before the move
    return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device=device)


def build_gcdit_from_wan(
    paths: Iterable[Path | str],
    *,
    expected_sha256: Mapping[str, str],
    vocab: Vocab = "parts",
    cfg: DiTConfig | None = None,
    device: Any = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    expected_key_hash: str = WAN22_TI2V_5B_HASH,
    seed: int = 0,
):
    """GcDiT with pretrained Wan weights (read as bf16, then cast to ``dtype``) and a fresh
    ``gc_sem_cond`` (zero last layer): the SFT init."""
    cfg = cfg or full_config(vocab)
    sd = load_wan_state_dict(
        paths, expected_sha256=expected_sha256, expected_key_hash=expected_key_hash, dtype=torch.bfloat16
    )
    from gc25d_core.models.configs import build_meta

    check_wan_keys(build_meta(cfg).state_dict().keys(), sd.keys())
    with torch.random.fork_rng(devices=[]):  # the caller's CPU generator state is kept
        torch.manual_seed(seed)
        enc = SemCondEncoder(cfg.vocab, dim=cfg.dim, hidden=cfg.sem_hidden)
    sd.update({f"{SEM_COND_NAME}.{k}": v.to(torch.bfloat16) for k, v in enc.state_dict().items()})
    return _materialize(cfg, sd, device, dtype)


def load_gc_weights(
    path: Path | str,
    model: torch.nn.Module | None = None,
    *,
    device: Any = "cpu",
    dtype: torch.dtype | None = None,
    expected_sha256: str | None = None,
) -> tuple[torch.nn.Module, ExportMeta]:
    """Load a gc25d export. Without ``model`` a GcDiT is built from the recorded config (vocab from
    the tensor shapes); with one, its config must match and its parameters are overwritten."""
    path = Path(path)
    if expected_sha256 is not None:
        verify_sha256([path], {path.name: expected_sha256})
    sd, meta = read_export(path)
    if model is None:
        return _materialize(meta.dit_config, sd, device, dtype), meta
    mine = getattr(model, "gc_config", None)
    if getattr(model, "vocab", meta.vocab) != meta.vocab:
        raise WeightsError(f"{path}: export vocab {meta.vocab!r} but the model is {model.vocab!r}")
    if mine is not None and mine.architecture() != meta.dit_config.architecture():
        raise WeightsError(f"{path}: export config {meta.dit_config} differs from the model's {mine}")
    model.load_state_dict(sd, strict=True)
    return model, meta
