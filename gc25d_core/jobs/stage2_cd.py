"""SPEC §8 stage 2 (causal consistency distillation with an EMA target) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage2_cd --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage2_cd`` section is a ``Stage2Config``
(gc25d_core.train.config; presets in configs/stage2_cd/), its init stage 1's final.json.
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import run_job, stage_parser
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.stage2_cd import run_stage2

    run_stage2(cfg, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


if __name__ == "__main__":
    run_job(stage_parser(__doc__.splitlines()[0], "stage2_cd"), main)
