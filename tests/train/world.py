"""The synthetic training worlds, kept importable under their test-suite name
(they live in gc25d_core.train.synthetic, where bench/ can use them too)."""

from gc25d_core.train.synthetic import (  # noqa: F401
    STARTS,
    TRAIN_RUNS,
    VAL_RUN,
    _ids,
    _meta,
    latent_from_ids,
    random_teacher,
    sft_world,
    stage1_world,
    stage2_world,
    stage3_world,
    synthetic_row,
    write_clips,
    write_config,
    write_synthetic_latents,
)
