"""Train (or resume) one stage of the table (gc25d_core.stages) under torchrun; resumes from the run
folder by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.train --stage NAME --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``NAME`` section is that stage's section (presets in
configs/NAME/); a stage after the SFT starts from the hand-off file its ``model.handoff`` names.
"""

from __future__ import annotations

import argparse

from gc25d_core.config import Gc25dConfig
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.report import Reporter
from gc25d_core.stages import BY_NAME


def parser(stage: str | None = None) -> argparse.ArgumentParser:
    """The stage job's arguments; ``stage`` given: an alias entry point of that stage (no --stage)."""
    p = base_parser(__doc__.splitlines()[0])
    if stage is None:
        p.add_argument("--stage", required=True, choices=sorted(BY_NAME), help="the stage to train")
    else:
        p.set_defaults(stage=stage)
    p.add_argument(
        "--max-steps", type=int, default=None, help="stop at this step (default the section's max_steps)"
    )
    p.add_argument("--fresh", action="store_true", help="delete state, exports and logs; start at step 0")
    return p


def train(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
    from gc25d_core.train.loop import run_stage

    run_stage(cfg, args.stage, args.run_dir, rep, max_steps=args.max_steps, fresh=args.fresh)


def main(stage: str | None = None) -> None:
    run_job(parser(stage), train)


if __name__ == "__main__":
    main()
