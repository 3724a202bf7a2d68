"""SPEC §8 stage 3 (DMD with self-rollout, a critic, FSDP) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage3_dmd --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage3_dmd`` section is a ``Stage3Config``
(gc25d_core.train.config; presets in configs/stage3_dmd/): the generator stage 2's EMA final export, the real score and critic the SFT teacher.
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import run_job, stage_parser
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.stage3_dmd import run_stage3

    run_stage3(cfg, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


if __name__ == "__main__":
    run_job(stage_parser(__doc__.splitlines()[0], "stage3_dmd"), main)
