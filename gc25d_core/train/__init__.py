"""Training stages (DESIGN.md §2 ``train/``).

    sft     SPEC §7 bidirectional teacher: ``run_sft(cfg, run_dir, reporter)``, config section
            ``extra.sft`` (``SftConfig``, presets configs/sft/*.yaml via ``with_sft``)
    pick    SPEC §10 teacher pick: ``pick_sft(scores)`` / ``pick_sft_run(run_dir)``

``sft`` imports torch, DeepSpeed and DiffSynth; import it explicitly. ``pick`` is light.
"""

from gc25d_core.train.pick import PickError, SftPick, pick_sft, pick_sft_run

__all__ = ["PickError", "SftPick", "pick_sft", "pick_sft_run"]
