"""SPEC §8 stage 3 (DMD with self-rollout, a critic, FSDP) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage3_dmd --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage3_dmd`` section is a ``Stage3Config``
(gc25d_core.train.config; presets in configs/stage3_dmd/): the generator stage 2's EMA final export, the real score and critic the SFT teacher.
"""

from gc25d_core.jobs.common import stage_job

if __name__ == "__main__":
    stage_job("stage3_dmd", __doc__)
