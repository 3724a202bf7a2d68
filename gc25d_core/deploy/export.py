"""The deploy export (SPEC §6 file + the causal metadata a session needs).

``write_deploy_export(source, out)`` copies a causal export (stage 3's EMA by default; any causal
export the user picks) into the SPEC §6 file with its metadata kept (vocab, data, dit_config, the
denoise axis, sink / window / RoPE cap, the stage's own keys) plus ``deploy_source`` (the source
file and its SHA256) and ``init_chain``: the chain of init checkpoints, followed through each
export's ``init_ckpt`` from headers only (stage 3 <- stage 2 EMA <- stage 1 <- SFT pick <- ...), inside
the runs root, each file's hash checked before its header is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gc25d_core.hashing import sha256_file
from gc25d_core.models.export import ExportError, read_export, read_header, save_export

MAX_CHAIN = 16


def init_chain(first: dict[str, str], runs_root: Path | str | None = None) -> list[dict[str, Any]]:
    """[{path, sha256, stage, step, found}, ...] from an export's metadata ``first`` backwards.

    An ``init_ckpt`` path is relative to the runs root (absolute in exports written before); only
    files inside ``runs_root`` are followed (``found`` false otherwise, or without a runs root), and
    each one's recorded SHA256 is checked before its header is read: a mismatch ends the chain
    (``sha256_ok`` false), as does a file that is not a readable export (``error``)."""
    chain: list[dict[str, Any]] = []
    meta = first
    root = Path(runs_root).resolve() if runs_root is not None else None
    while "init_ckpt" in meta and len(chain) < MAX_CHAIN:
        try:
            ref = json.loads(meta["init_ckpt"])
            name, sha = Path(str(ref.get("path", ""))), ref.get("sha256")
        except (ValueError, AttributeError):
            raise ExportError(f"init_ckpt metadata is not a JSON object: {meta['init_ckpt']!r}") from None
        item: dict[str, Any] = {"path": str(name), "sha256": sha, "found": False}
        chain.append(item)
        if root is None:
            break
        path = (root / name).resolve()  # an absolute name (older exports) stays as it is
        if not path.is_relative_to(root) or not path.is_file():
            break
        item["found"] = True
        if isinstance(sha, str) and sha256_file(path) != sha:
            item["sha256_ok"] = False
            break
        try:
            meta = read_header(path).metadata or {}
        except ExportError as e:
            item["error"] = str(e)
            break
        item.update(stage=meta.get("stage"), step=meta.get("step"))
    return chain


def _under(path: Path, runs_root: Path | str | None) -> str:
    """``path`` relative to the runs root where it lies inside it (as hand-offs name exports)."""
    resolved = path.resolve()
    if runs_root is not None and resolved.is_relative_to(root := Path(runs_root).resolve()):
        return str(resolved.relative_to(root))
    return str(resolved)


def write_deploy_export(
    source: Path | str,
    out: Path | str,
    expected_sha256: str | None = None,
    runs_root: Path | str | None = None,
) -> dict[str, Any]:
    """Write the deploy export; returns its summary (path, sha256, source, chain, keys). The chain of
    init checkpoints is followed inside ``runs_root`` (``init_chain``)."""
    source, out = Path(source), Path(out)
    sd, meta = read_export(source, expected_sha256=expected_sha256)  # the hash before anything is parsed
    if meta.causal is None or meta.denoise_axis is None:
        raise ExportError(f"export {source}: causal=false — the deploy export needs a causal export")
    raw = read_header(source).metadata or {}
    src = {
        "path": _under(source, runs_root),
        "sha256": expected_sha256 or sha256_file(source),
        "stage": raw.get("stage"),
        "step": raw.get("step"),
        "weights": raw.get("weights"),
    }
    chain = init_chain(raw, runs_root)
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


def export_and_check(
    source: Path | str,
    out: Path | str,
    *,
    expected_sha256: str | None,
    vocab: str,
    runs_root: Path | str | None,
) -> dict[str, Any]:
    """``write_deploy_export``, then the file read back through the runtime's own loader
    (gc25d_core.deploy.runtime.load_deploy_model) and checked against the SPEC §6 / §8 contract: the
    summary plus ``problems`` (empty: deployable), the loaded model's key count and the metadata a
    session reads. JSON-able: the deploy_export job writes it next to the file."""
    from gc25d_core.deploy.runtime import contract_problems, load_deploy_model

    summary = write_deploy_export(source, out, expected_sha256=expected_sha256, runs_root=runs_root)
    model, meta = load_deploy_model(out, vocab=vocab, expected_sha256=summary["sha256"])
    num_keys = len(model.state_dict())
    return {
        **summary,
        "keys": num_keys,
        "problems": contract_problems(meta, num_keys),
        "vocab": meta.vocab,
        "causal": meta.causal.model_dump() if meta.causal else None,
        "denoise_axis": list(meta.denoise_axis or ()),
        "step": int(meta.extra.get("step", "0") or 0),
    }
