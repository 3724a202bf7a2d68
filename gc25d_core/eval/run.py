"""The eval job (``python -m gc25d_core.jobs.eval``): the exports ``eval_input.json`` names, on the
sweeps, their cases shared among the ranks, the reports written by rank 0.

Every rank reads the same cases and builds each export's sampler; case i of a sweep is rolled out on
rank i % world_size (``evaluate.roll_cases``); rank 0 gathers the scores and aggregates them in the
cases' order (``evaluate.assemble``), so the numbers are those of one rank. It then writes the files
of ``eval.report`` into the run folder and ``eval_output.json`` (``eval.spec``).

Each export's result is kept in ``results/<label>.json`` (written atomically by rank 0) under a key
of everything it depends on: the export (its SHA256 first), the sweeps' settings, the snapshot, the
cases and the resolved config. A retry or a relaunch takes the results it finds under the same key
and evaluates the other exports only, so an eval interrupted part-way resumes where it stopped.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import barrier, broadcast_ints, dist_active, global_rank, world_size
from gc25d_core.eval.evaluate import (
    CaseResults,
    Reference,
    assemble,
    build_sampler,
    load_cases,
    roll_cases,
    vae_decoder,
)
from gc25d_core.eval.report import strips_of, write_reports
from gc25d_core.eval.spec import (
    INPUT_FILE,
    OUTPUT_FILE,
    EvalExport,
    EvalInput,
    EvalOutput,
    read_model,
    write_model,
)
from gc25d_core.eval.sweeps import Case
from gc25d_core.report import Reporter

RESULTS_DIR = "results"


def without_deployed_copies(
    exports: list[EvalExport], skipped: list[str]
) -> tuple[list[EvalExport], list[str]]:
    """A deploy export holds the weights of the export it was copied from (stage 3's EMA by
    default): when that one is evaluated too, its rollouts would be the same, so it is left out."""
    from gc25d_core.models.export import deployed_from

    by_sha = {e.sha256: e.label for e in exports if e.sha256 is not None}
    kept: list[EvalExport] = []
    skipped = list(skipped)
    for e in exports:
        source = deployed_from(e.path, e.sha256)  # the file's hash is checked before its header is read
        if source is not None and source in by_sha and by_sha[source] != e.label:
            skipped.append(f"{e.label}: the same weights as {by_sha[source]} (its deploy copy)")
            continue
        kept.append(e)
    return kept, skipped


def result_key(cfg: Gc25dConfig, spec: EvalInput, export: EvalExport, cases: dict[str, list[Case]]) -> str:
    """What a kept result must have been made from to be taken instead of evaluating again."""
    doc = {
        "export": {**asdict(export), "path": str(export.path)},
        "eval": spec.eval.model_dump(mode="json"),
        "manifest_version": spec.manifest_version,
        "cases": {sweep: [c.case_id for c in cs] for sweep, cs in cases.items()},
        "config": cfg.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON")


def save_result(path: Path, key: str, result: dict[str, Any]) -> None:
    """``result`` (its strips as base64) under ``key``; NaN kept as NaN so that a kept result gives
    the same report files as a fresh one (``report.dumps`` turns them into null there)."""
    doc = {k: v for k, v in result.items() if k not in ("rollouts", "strips")}
    strips = {s: None if p is None else base64.b64encode(p).decode() for s, p in strips_of(result).items()}
    text = json.dumps({"key": key, "result": doc, "strips": strips}, allow_nan=True, default=_plain)
    atomic_write_text(path, text)


def load_result(path: Path, key: str) -> dict[str, Any] | None:
    """The result kept under ``key``, or None (none there, another key, or unreadable: evaluate again)."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("key") != key:
            return None
        result = dict(doc["result"])
        result["strips"] = {s: None if b is None else base64.b64decode(b) for s, b in doc["strips"].items()}
        return result
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _at_rank0(obj: Any) -> list[Any] | None:
    """``obj`` of every rank, in rank order, on rank 0 (None on the others); a collective."""
    if not dist_active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] | None = [None] * world_size() if global_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def evaluate_shared(
    export: EvalExport,
    cfg: Gc25dConfig,
    spec: EvalInput,
    cases: dict[str, list[Case]],
    ref: Reference,
    device: torch.device,
    rep: Reporter,
) -> dict[str, Any] | None:
    """One export over every rank: its result on rank 0 (strips made, rollouts dropped), else None."""
    rank, world = global_rank(), world_size()
    sampler = build_sampler(export, cfg, spec.eval, device)
    mine = roll_cases(
        export.label, sampler, cfg, spec.eval, cases, ref, log=rep.log, rank=rank, world_size=world
    )
    parts = _at_rank0(mine)
    if parts is None:
        return None
    done: CaseResults = {}
    for part in parts:
        done.update(part)
    result = assemble(export, sampler.describe(), spec.eval, cases, done)
    result["strips"] = strips_of(result)
    del result["rollouts"]
    return result


def run_eval(cfg: Gc25dConfig, run_dir: Path, rep: Reporter) -> EvalOutput | None:
    """Evaluate ``run_dir/eval_input.json``; on rank 0 the reports and ``eval_output.json`` (returned)."""
    from gc25d_core.distributed import pick_device

    run_dir = Path(run_dir)
    spec = read_model(run_dir, INPUT_FILE, EvalInput)
    ecfg, rank, world = spec.eval, global_rank(), world_size()
    exports, skipped = without_deployed_copies(list(spec.exports), spec.not_evaluated)
    cases, clips = load_cases(cfg, ecfg, spec.manifest_version)
    num_cases = {sweep: len(c) for sweep, c in cases.items()}
    rep.log(
        f"snapshot v{spec.manifest_version:06d}: "
        + ", ".join(f"{sweep} {n} cases" for sweep, n in num_cases.items())
        + f"; exports {[e.label for e in exports]}; {world} rank{'s' if world > 1 else ''}"
    )
    device = pick_device(cfg)
    decode = None
    if ecfg.decode:
        from gc25d_core.models.vae import build_vae_for

        decode = vae_decoder(build_vae_for(cfg, device))
    ref = Reference(clips, decode)
    results: list[dict[str, Any]] = []
    for export in exports:
        path = run_dir / RESULTS_DIR / f"{export.label}.json"
        key = result_key(cfg, spec, export, cases)
        kept = load_result(path, key) if rank == 0 else None
        if broadcast_ints([kept is not None], device)[0]:  # every rank skips it, or none does
            rep.log(f"{export.label}: the result of an earlier attempt is kept ({path})")
            if kept is not None:
                results.append(kept)
            continue
        result = evaluate_shared(export, cfg, spec, cases, ref, device, rep)
        if result is not None:
            save_result(path, key, result)
            results.append(result)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out = None
    if rank == 0:
        files = write_reports(run_dir, results, ecfg.psnr_cap_db)
        rep.log("eval table\n" + files.table)
        out = EvalOutput(
            exports=[e.label for e in exports],
            not_evaluated=skipped,
            plots=list(files.plots),
            num_cases=num_cases,
        )
        write_model(run_dir, OUTPUT_FILE, out)
        rep.materialize({"world_size": world, "num_cases": num_cases})
    barrier()  # the ranks end together: none tears the group down while rank 0 still writes
    return out
