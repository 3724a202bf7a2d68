"""The one place that works around third-party install traps.

torchvision stub: the registry's torchvision wheels are CUDA builds. Beside a CPU torch their C
extension cannot load, and ``torchvision/_meta_registrations.py`` then fails at import with
"operator torchvision::nms does not exist" — and ``import diffsynth`` imports torchvision, so every
DiffSynth import fails (research/diffsynth_wan22.md §1). The Wan path never uses torchvision ops,
so on a CPU-only torch we register an empty module under that name before torchvision loads.
On CUDA torch the real module is left alone.

FlashAttention-2 probe: DiffSynth's Wan DiT takes its FA2 branch when ``import flash_attn``
succeeds, but flash-attn-4 (our optional ``attn_backend: fa4``) installs a package of that name
without ``flash_attn_func``, so every DiffSynth Wan attention then fails with AttributeError (seen
on the H200, 2026-11-30). The probe is corrected to "FA2 present" only when the function exists.
"""

from __future__ import annotations

import os
import sys
import types


def patch_torchvision_for_cpu_torch() -> None:
    import torch

    if torch.version.cuda is None and "torchvision" not in sys.modules:
        sys.modules.setdefault(
            "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
        )


def import_diffsynth():
    """Import diffsynth offline (no hub downloads) with the torchvision workaround applied."""
    os.environ.setdefault("DIFFSYNTH_SKIP_DOWNLOAD", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    patch_torchvision_for_cpu_torch()
    import diffsynth
    from diffsynth.models import wan_video_dit

    repair_fa2_probe(wan_video_dit)
    return diffsynth


def repair_fa2_probe(wan_dit: types.ModuleType) -> None:
    """Clear ``wan_dit.FLASH_ATTN_2_AVAILABLE`` when its ``flash_attn`` is not FlashAttention-2."""
    if getattr(wan_dit, "FLASH_ATTN_2_AVAILABLE", False) and not hasattr(
        getattr(wan_dit, "flash_attn", None), "flash_attn_func"
    ):
        setattr(wan_dit, "FLASH_ATTN_2_AVAILABLE", False)  # noqa: B010 (a module attribute mypy cannot see)
