"""SPEC §7 SFT (the bidirectional teacher) under torchrun; resumes from the run folder by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.sft --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``sft`` section is an ``SftConfig``
(gc25d_core.train.config; presets in configs/sft/).
"""

from gc25d_core.jobs.common import stage_job

if __name__ == "__main__":
    stage_job("sft", __doc__)
