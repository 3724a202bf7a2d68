"""SPEC §8 stage 1 (teacher forcing: the causal student) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage1_tf --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage1_tf`` section is a ``Stage1Config``
(gc25d_core.train.config; presets in configs/stage1_tf/), its init the SFT pick's teacher.json.
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import run_job, stage_parser
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.stage1_tf import run_stage1

    run_stage1(cfg, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


if __name__ == "__main__":
    run_job(stage_parser(__doc__.splitlines()[0], "stage1_tf"), main)
