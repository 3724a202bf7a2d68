"""Build ``gc25d_training_cache_v1`` samples from the processed layout (SPEC §5) for pack_shard.

rec = layout.read_latents(layout.latents(cid), shapes)        # latents/<clip_id>.pt
ids = layout.read_cond(layout, cid, shapes)                   # optional cond/<clip_id>.npz
sample = gc25d_sample(rec, cond_ids=ids)                      # (sample_id, tensors, json)
pack_shard(store, worker=..., name=..., samples=[sample, ...], schema=SCHEMA_GC25D)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

JSON_KEYS = ("clip_id", "subset", "scene", "run", "start", "prompts")
MASKING_META = {"world_to_clip": np.float64, "world_to_view": np.float64, "ground_z": np.float32}


def _u8(a: Any) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else torch.as_tensor(a)
    if t.dtype != torch.uint8:
        raise TypeError(f"expected uint8, got {t.dtype}")
    return t.contiguous().clone()  # own storage: torch.save writes a view's whole storage


def gc25d_sample(
    latents_record: Mapping[str, Any],
    *,
    cond_ids: Any | None = None,
    cond_ext: Mapping[str, Any] | None = None,
    ext_source: str | None = None,
    masking_meta: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]]:
    """``latents_record``: a validated latents/<clip_id>.pt dict (latent bf16 [48,21,H,W],
    actions_block uint8 [21,5], prompts, clip_id, subset, scene, run, start).
    ``cond_ids``: uint8 [81,h,w]; ``cond_ext``: a cond_ext / cond_ext_canvas npz dict (ids
    [28,h,w], blocks [7,5], prompts [7]); ``ext_source``: "cond_ext" or "ext_canvas";
    ``masking_meta``: a meta npz dict: its clip frames' world_to_clip / world_to_view / ground_z
    travel with the sample (SFT's UNKNOWN masking)."""
    latent = latents_record["latent"]
    if not isinstance(latent, torch.Tensor) or latent.dtype != torch.bfloat16:
        raise TypeError("latent must be a bfloat16 tensor")
    tensors: dict[str, torch.Tensor] = {
        "latent": latent.contiguous().clone(),
        "actions_block": _u8(latents_record["actions_block"]),
    }
    meta: dict[str, Any] = {k: latents_record[k] for k in JSON_KEYS}
    meta["prompts"] = [str(p) for p in meta["prompts"]]
    meta["start"] = int(meta["start"])
    if cond_ids is not None:
        tensors["cond_ids"] = _u8(cond_ids)
    if masking_meta is not None:
        for key, dtype in MASKING_META.items():
            tensors[key] = torch.from_numpy(np.ascontiguousarray(masking_meta[key][:81], dtype=dtype)).clone()
    meta["has_ext"] = cond_ext is not None
    if cond_ext is not None:
        tensors["cond_ext_ids"] = _u8(cond_ext["ids"])
        tensors["ext_blocks"] = _u8(cond_ext["blocks"])
        meta["ext_prompts"] = [str(p) for p in cond_ext["prompts"]]
        if ext_source is not None:
            meta["ext_source"] = ext_source
    return str(latents_record["clip_id"]), tensors, meta
