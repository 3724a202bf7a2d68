"""The eval job (``python -m gc25d_core.jobs.eval``): the exports ``eval_input.json`` names, on the
sweeps, their cases shared among the ranks, the reports written by rank 0.

Every rank reads the same cases and builds each export's sampler; case i of a dataset sweep is
rolled out on rank i % world_size (``evaluate.roll_cases``); rank 0 gathers the scores and
aggregates them in the cases' order (``evaluate.assemble``), so the numbers are those of one rank.
The live sweeps (``eval.live``) share their rollouts among the ranks the same way
(``eval.live_run``). Rank 0 then writes the files of ``eval.report`` into the run folder and
``eval_output.json`` (``eval.spec``).

Each (export, sweep) result is a row of the result store (``eval.store``), keyed by the export's
SHA256, the sweep's definition, the preset's relevant fields and the code's version: a rerun with
nothing changed computes nothing, a changed export recomputes its rows only, and an eval
interrupted part-way resumes where it stopped. Exports with the same SHA256 are evaluated once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import barrier, broadcast_ints, dist_active, global_rank, world_size
from gc25d_core.eval.evaluate import (
    CaseResults,
    Reference,
    assemble,
    build_sampler,
    export_doc,
    load_cases,
    roll_cases,
    vae_decoder,
)
from gc25d_core.eval.live import KINDS, LiveBackend, LiveSweep, live_sweep
from gc25d_core.eval.live_run import run_live
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
from gc25d_core.eval.store import (
    ResultStore,
    code_version,
    context_doc,
    job_key,
    row_key,
    used_files,
)
from gc25d_core.eval.sweeps import Case
from gc25d_core.hashing import file_identities
from gc25d_core.numerics import numerics_record
from gc25d_core.report import Reporter

# the job's live session code and world (gc25d_core.jobs.eval_live.DeployBackend): (vae, device) -> backend
BackendFactory = Callable[[Any, torch.device], LiveBackend]


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


def is_causal(export: EvalExport) -> bool:
    from gc25d_core.models.export import read_export_meta

    return read_export_meta(export.path, export.sha256).causal is not None


def with_sha256(export: EvalExport) -> EvalExport:
    """The export with its file's SHA256 (a hand-off without one: hashed here; the result's key)."""
    if export.sha256 is not None:
        return export
    from gc25d_core.hashing import sha256_file

    return replace(export, sha256=sha256_file(export.path))


def clip_sweep_doc(sweep: str, spec: EvalInput, cases: list[Case]) -> dict[str, Any]:
    """What a dataset sweep's row depends on besides the export: its settings, snapshot and cases."""
    e = spec.eval
    settings = e.model_dump(
        mode="json", exclude={"live_sweeps", "live_cells", "clip28_clips", "chain241_chains"}
    )
    settings = {k: v for k, v in settings.items() if not k.endswith("_cells") or k.startswith(sweep)}
    return {
        "sweep": sweep,
        "settings": settings,
        "manifest_version": spec.manifest_version,
        "cases": [c.case_id for c in cases],
    }


def live_sweep_doc(sweep: LiveSweep, spec: EvalInput, world: dict[str, Any]) -> dict[str, Any]:
    doc = {"live": sweep.definition(), "world": world, "psnr_cap_db": spec.eval.psnr_cap_db}
    return doc | ({"ceiling": True} if spec.eval.live_ceiling else {})  # a row with it is another row


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


def run_eval(
    cfg: Gc25dConfig, run_dir: Path, rep: Reporter, backend: BackendFactory | None = None
) -> EvalOutput | None:
    """Evaluate ``run_dir/eval_input.json``; on rank 0 the reports and ``eval_output.json`` (returned).
    The live sweeps need ``backend``."""
    from gc25d_core.distributed import pick_device

    run_dir = Path(run_dir)
    spec = read_model(run_dir, INPUT_FILE, EvalInput)
    ecfg, rank, world = spec.eval, global_rank(), world_size()
    located = [e.located(cfg.paths.runs_root) for e in spec.exports]
    exports, skipped = without_deployed_copies(located, spec.not_evaluated)
    exports = [with_sha256(e) for e in exports]
    first: dict[str | None, EvalExport] = {}
    for e in exports:  # one evaluation per SHA256: a second label of the same weights reuses it
        first.setdefault(e.sha256, e)
    unique = list(first.values())
    live = [live_sweep(n, ecfg.live_cells) for n in ecfg.live_sweeps]
    if live and backend is None:
        raise ValueError(f"live sweeps {ecfg.live_sweeps} need the live session code (run_eval's backend)")
    cases: dict[str, list[Case]] = {}
    clips: dict[str, Any] = {}
    if ecfg.clip28_clips or ecfg.chain241_chains:
        cases, clips = load_cases(cfg, ecfg, spec.manifest_version)
        cases = {s: c for s, c in cases.items() if c}
    num_cases = {sweep: len(c) for sweep, c in cases.items()} | {s.name: 1 for s in live}
    rep.log(
        f"snapshot v{spec.manifest_version:06d}: "
        + ", ".join(f"{sweep} {n} case{'s' if n > 1 else ''}" for sweep, n in num_cases.items())
        + f"; exports {[e.label for e in exports]}; {world} rank{'s' if world > 1 else ''}"
    )
    device = pick_device(cfg)
    vae = None
    if ecfg.decode or live:
        from gc25d_core.models.vae import build_vae_for

        vae = build_vae_for(cfg, device)
    live_backend = backend(vae, device) if backend is not None and live else None
    code, ctx, store = code_version(), context_doc(cfg, vae is not None), ResultStore.of(cfg)
    here = numerics_record(device.type)  # kept with each row this run computes
    docs: dict[str, dict[str, Any]] = {s: clip_sweep_doc(s, spec, c) for s, c in cases.items()}
    if live_backend is not None:
        docs |= {s.name: live_sweep_doc(s, spec, live_backend.describe()) for s in live}
    causal = {e.label: is_causal(e) for e in unique}  # the bidirectional teacher has no live session
    keys = {
        (e.label, s): row_key(code, e.sha256 or "", doc, ctx)
        for e in unique
        for s, doc in docs.items()
        if s in cases or causal[e.label]
    }
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    if rank == 0:
        rows = {k: row for k, key in keys.items() if (row := store.get(key)) is not None}
    missing = broadcast_ints([k not in rows for k in keys], device)  # every rank: the same work
    todo = {k for k, m in zip(keys, missing, strict=True) if m}
    kept = sorted(f"{label}/{s}" for label, s in keys if (label, s) not in todo)
    computed = {s: 0 for s in docs}
    ref = Reference(clips, vae_decoder(vae) if ecfg.decode else None)  # decodes each true clip once
    for e in unique:
        sub = {s: c for s, c in cases.items() if (e.label, s) in todo}
        if not sub:
            continue
        result = evaluate_shared(e, cfg, spec, sub, ref, device, rep)
        for s in sub:
            computed[s] += len(sub[s])
            if result is not None:
                rows[e.label, s] = {
                    "sampler": result["sampler"],
                    "sweep": result["sweeps"][s],
                    "strip": result["strips"].get(s),
                    "numerics": here,
                }
                store.put(keys[e.label, s], rows[e.label, s])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    pending = [(e, ls) for e in unique for ls in live if (e.label, ls.name) in todo]
    if pending:
        assert live_backend is not None
        got = run_live(
            cfg,
            live_backend,
            vae,
            pending,
            run_dir,
            ecfg.psnr_cap_db,
            rep.log,
            keep=lambda k, row: store.put(keys[k], {**row, "numerics": here}),  # stored as soon as it exists
            ceiling=ecfg.live_ceiling,
        )
        for e, ls in pending:
            computed[ls.name] += len(KINDS)
            if got is not None:
                rows[e.label, ls.name] = {**got[e.label, ls.name], "numerics": here}
    rep.log(f"computed {computed}; kept {len(kept)} rows of earlier runs")
    out = None
    if rank == 0:
        results = [export_result(e, first[e.sha256].label, ecfg, docs, rows) for e in exports]
        files = write_reports(run_dir, results, ecfg.psnr_cap_db)
        rep.log("eval table\n" + files.table)
        out = EvalOutput(
            exports=[e.label for e in exports],
            not_evaluated=skipped,
            plots=list(files.plots),
            num_cases=num_cases,
            computed=computed,
            kept=kept,
            job_key=job_key(cfg, (run_dir / INPUT_FILE).read_text()),
            depends_on=file_identities(used_files(cfg, vae is not None)),
        )
        write_model(run_dir, OUTPUT_FILE, out)
        rep.materialize({"world_size": world, "num_cases": num_cases, "computed": computed})
    barrier()  # the ranks end together: none tears the group down while rank 0 still writes
    return out


def export_result(
    export: EvalExport,
    evaluated_as: str,
    ecfg: Any,
    sweeps: dict[str, Any],
    rows: dict[tuple[str, str], dict[str, Any]],
) -> dict[str, Any]:
    """An export's result (eval.report's input) from its rows (those of ``evaluated_as``: the first
    export with its SHA256)."""
    mine = {s: rows[evaluated_as, s] for s in sweeps if (evaluated_as, s) in rows}
    sampler = next((r["sampler"] for s, r in mine.items() if s in ("clip28", "chain241")), None)
    return {
        "export": export_doc(export),
        "sampler": sampler or next(iter(mine.values()))["sampler"] if mine else {"kind": "none"},
        "eval": ecfg.model_dump(),
        "same_as": evaluated_as if evaluated_as != export.label else None,
        "sweeps": {s: r["sweep"] for s, r in mine.items()},
        "strips": {s: r["strip"] for s, r in mine.items()},
        "numerics": {s: r.get("numerics") for s, r in mine.items()},
    }
