"""SPEC §8 stage 1 (teacher forcing: the causal student) under torchrun; resumes by default.

torchrun --nproc_per_node=8 -m gc25d_core.jobs.stage1_tf --config run.yaml --run-dir DIR [--max-steps N] [--fresh]

The config is a resolved Gc25dConfig whose ``stage1_tf`` section is a ``Stage1Config``
(gc25d_core.train.config; presets in configs/stage1_tf/), its init the SFT pick's teacher.json.
"""

from gc25d_core.jobs.common import stage_job

if __name__ == "__main__":
    stage_job("stage1_tf", __doc__)
