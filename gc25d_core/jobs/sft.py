"""SPEC §7 SFT (the bidirectional teacher) under torchrun; resumes from the run folder by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.sft --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``sft`` section is an ``SftConfig``
(gc25d_core.train.config; presets in configs/sft/).
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import run_job, stage_parser
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.sft import run_sft

    run_sft(cfg, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


if __name__ == "__main__":
    run_job(stage_parser(__doc__.splitlines()[0], "sft"), main)
