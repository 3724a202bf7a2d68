"""The one place that works around third-party install traps.

torchvision stub: the registry's torchvision wheels are CUDA builds. Beside a CPU torch their C
extension cannot load, and ``torchvision/_meta_registrations.py`` then fails at import with
"operator torchvision::nms does not exist" — and ``import diffsynth`` imports torchvision, so every
DiffSynth import fails (research/diffsynth_wan22.md §1). The Wan path never uses torchvision ops,
so on a CPU-only torch we register an empty module under that name before torchvision loads.
On CUDA torch the real module is left alone.
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

    return diffsynth
