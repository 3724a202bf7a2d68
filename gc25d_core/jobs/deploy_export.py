"""The SPEC §6 deploy file of one export under torchrun (gc25d_core.deploy.export.export_and_check).

torchrun --nproc_per_node=1 -m gc25d_core.jobs.deploy_export --config RUN/config.yaml --run-dir RUN \
    --source EXPORT --sha256 HEX --out RUN/deploy.safetensors --summary RUN/deploy.json [--label TEXT]

Rank 0 writes the deploy file, checks it through the runtime's loader, writes the summary JSON (the
init chain and the contract's problems, which the deploy_export asset shows and checks) and the
hand-off RUN/final.json that eval and ``make play`` read. A relaunch writes them again (seconds).
"""

import argparse
from pathlib import Path

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    import json

    from gc25d_core.atomic import atomic_write_text
    from gc25d_core.deploy.export import export_and_check
    from gc25d_core.handoff import FINAL, handoff_of, runs_relative, write_handoff_file
    from gc25d_core.models.export import ExportError

    if rep.rank != 0:  # one file: rank 0 writes it
        return
    out = args.out
    try:
        s = export_and_check(
            args.source, out, expected_sha256=args.sha256, vocab=cfg.vocab, runs_root=cfg.paths.runs_root
        )
    except ValueError as e:  # a bad export is the same on every attempt: named so it is not retried
        raise ExportError(f"deploy_export from {args.label}: {e}") from None
    root = cfg.paths.runs_root  # the record's paths relative to it: a moved runs root keeps it true
    s = {
        **s,
        "path": runs_relative(out, root),
        "source_label": args.label,
        "source_path": runs_relative(args.source, root),
    }
    atomic_write_text(args.summary, json.dumps(s, indent=1))
    write_handoff_file(
        args.run_dir / FINAL, handoff_of("deploy", s["step"], out, runs_root=cfg.paths.runs_root)
    )
    rep.log(f"{out}: {s['keys']} keys, contract problems: {s['problems'] or 'none'}")
    rep.materialize(
        {"sha256": s["sha256"], "source": args.label, "keys": s["keys"], "problems": s["problems"]},
        data_version=s["sha256"][:16],
    )


if __name__ == "__main__":
    p = base_parser((__doc__ or "").splitlines()[0])
    p.add_argument("--source", required=True, help="the causal export to deploy")
    p.add_argument("--sha256", required=True, help="its SHA256 (checked before it is read)")
    p.add_argument("--out", type=Path, required=True, help="the deploy file to write")
    p.add_argument("--summary", type=Path, required=True, help="the JSON summary to write")
    p.add_argument("--label", default="export", help="where it came from, for messages and metadata")
    run_job(p, main)
