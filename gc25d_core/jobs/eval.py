"""SPEC §10 evaluation of one snapshot's exports under torchrun (gc25d_core.eval.run).

torchrun --nproc_per_node=8 -m gc25d_core.jobs.eval --config RUN/config.yaml --run-dir RUN

RUN/eval_input.json (gc25d_core.eval.spec.EvalInput, written by the eval asset) names the snapshot,
the sweeps' settings and the exports; the cases are shared among the ranks, rank 0 writes the
reports into RUN. The live sweeps play through the deploy session code (jobs.eval_live). Results are
kept per (export, sweep) in <runs_root>/eval_results/ (eval.store): a rerun with nothing changed
computes nothing.
"""

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.eval.run import run_eval
    from gc25d_core.jobs.eval_live import DeployBackend

    run_eval(cfg, args.run_dir, rep, backend=lambda vae, device: DeployBackend(cfg, vae, device))


if __name__ == "__main__":
    run_job(base_parser((__doc__ or "").splitlines()[0]), main)
