"""The deploy export (SPEC §6 file + the causal metadata a session needs).

``write_deploy_export(source, out)`` copies a causal export (stage 3's EMA by default; any causal
export the user picks) into the SPEC §6 file with its metadata kept (vocab, data, dit_config, the
denoise axis, sink / window / RoPE cap, the stage's own keys) plus ``deploy_source`` (the source
file and its SHA256) and ``init_chain``: the chain of init checkpoints, followed through each
export's ``init_ckpt`` from headers only (stage 3 <- stage 2 EMA <- stage 1 <- SFT pick <- ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gc25d_core.hashing import sha256_file
from gc25d_core.models.export import ExportError, read_export, save_export

MAX_CHAIN = 16


def _header(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        return dict(f.metadata() or {})


def deployed_from(path: Path | str) -> str | None:
    """The SHA256 of the export a deploy export was copied from (its ``deploy_source``), from the
    header only; None for any other export."""
    raw = _header(Path(path)).get("deploy_source")
    if raw is None:
        return None
    try:
        sha = json.loads(raw).get("sha256")
    except (ValueError, AttributeError):
        raise ExportError(f"{path}: deploy_source metadata is not a JSON object: {raw!r}") from None
    return sha if isinstance(sha, str) else None


def init_chain(first: dict[str, str]) -> list[dict[str, Any]]:
    """[{path, sha256, stage, step, found}, ...] from an export's metadata ``first`` backwards."""
    chain: list[dict[str, Any]] = []
    meta = first
    while "init_ckpt" in meta and len(chain) < MAX_CHAIN:
        try:
            ref = json.loads(meta["init_ckpt"])
        except ValueError:
            raise ExportError(f"init_ckpt metadata is not JSON: {meta['init_ckpt']!r}") from None
        path = Path(ref.get("path", ""))
        item: dict[str, Any] = {"path": str(path), "sha256": ref.get("sha256"), "found": path.is_file()}
        if not path.is_file():
            chain.append(item)
            break
        meta = _header(path)
        item.update(stage=meta.get("stage"), step=meta.get("step"))
        chain.append(item)
    return chain


def write_deploy_export(
    source: Path | str, out: Path | str, expected_sha256: str | None = None
) -> dict[str, Any]:
    """Write the deploy export; returns its summary (path, sha256, source, chain, keys)."""
    from gc25d_core.models.loading import verify_sha256

    source, out = Path(source), Path(out)
    if expected_sha256 is not None:
        verify_sha256([source], {source.name: expected_sha256})
    sd, meta = read_export(source)
    if meta.causal is None or meta.denoise_axis is None:
        raise ExportError(f"export {source}: causal=false — the deploy export needs a causal export")
    raw = _header(source)
    src = {
        "path": str(source.resolve()),
        "sha256": expected_sha256 or sha256_file(source),
        "stage": raw.get("stage"),
        "step": raw.get("step"),
        "weights": raw.get("weights"),
    }
    chain = init_chain(raw)
    extra = {**meta.extra, "deploy_source": json.dumps(src), "init_chain": json.dumps(chain)}
    save_export(
        out,
        sd,
        dit_config=meta.dit_config,
        vocab=meta.vocab,
        causal=meta.causal,
        denoise_axis=meta.denoise_axis,
        data=meta.data,
        extra=extra,
    )
    return {"path": str(out), "sha256": sha256_file(out), "source": src, "init_chain": chain, "keys": len(sd)}
