"""SPEC §7 SFT (the bidirectional teacher) under torchrun; resumes from the run folder by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.sft --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``sft`` section is an ``SftConfig``
(gc25d_core.train.sft; presets in configs/sft/).
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter


def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.sft import run_sft

    run_sft(cfg, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


def parser() -> argparse.ArgumentParser:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=None, help="stop at this step (default sft.max_steps)")
    p.add_argument("--fresh", action="store_true", help="delete state, exports and logs; start at step 0")
    return p


if __name__ == "__main__":
    run_job(parser(), main)
