"""Fit the tiny VAE to the train split's frames (the ``tiny_vae`` asset; gc25d_core.preprocess.tiny_vae).

torchrun --nproc_per_node=1 -m gc25d_core.jobs.tiny_vae --config run.yaml --run-dir DIR

One process: the fit is small and sequential, and its weights must not depend on a world size.
A rerun with the same inputs (settings, clips, frames) keeps the file it wrote; the job's record
(``job_record``: the config, the clips index and the files it wrote, by identity) lets the asset
skip the launch while they stand.
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.distributed import global_rank
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.preprocess.tiny_vae import run_fit

    if global_rank() != 0:  # launched on more ranks by hand: the others have nothing to do
        return
    rec = run_fit(cfg, rep)
    if rec.get("used"):  # the asset's next materialization finds it and launches nothing
        from pathlib import Path

        from gc25d_core.job_record import keep_finished_job
        from gc25d_core.layout import Layout
        from gc25d_core.models.vae_fit import fit_file, record_file

        index = Layout(Path(cfg.paths.data_root)).clips_jsonl
        keep_finished_job(args.run_dir, [index], [fit_file(cfg), record_file(cfg)], rec)
    rep.materialize(rec, data_version=rec.get("sha256"))


if __name__ == "__main__":
    run_job(base_parser(__doc__.splitlines()[0]), main)
