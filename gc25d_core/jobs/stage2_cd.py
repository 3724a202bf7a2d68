"""SPEC §8 stage 2 (causal consistency distillation with an EMA target) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage2_cd --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage2_cd`` section is a ``Stage2Config``
(gc25d_core.train.config; presets in configs/stage2_cd/), its init stage 1's final.json.
"""

from gc25d_core.jobs.common import stage_job

if __name__ == "__main__":
    stage_job("stage2_cd", __doc__)
