"""Training stages on shared components (DESIGN.md §2 ``train/``; docs/architecture.md).

    config presets          typed stage sections (``Gc25dConfig.sft``) and configs/<stage>/*.yaml
    engine zero2 fsdp       one Trained protocol: accelerate ZeRO-2, FSDP FULL_SHARD, torch / DDP
    state safe_load ema     the run state (SHA256-checked weights-only slots), the EMA
    data inputs validation metrics model loop handoff   what every stage shares
    sft stage1_tf stage2_cd stage3_dmd   the stages: ``loop.run_stage(cfg, "<stage>", run_dir, reporter)``
    pick                    SPEC §10 teacher pick: ``pick_sft(scores)`` / ``pick_sft_run(run_dir)``

Only ``config``, ``presets`` and ``pick`` are light; the rest import torch (and DeepSpeed / DiffSynth
where they need them): import them explicitly.
"""

from gc25d_core.train.pick import PickError, SftPick, pick_sft, pick_sft_run

__all__ = ["PickError", "SftPick", "pick_sft", "pick_sft_run"]
