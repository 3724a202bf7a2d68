"""The one place that works around third-party install traps.

torchvision stub: the registry's torchvision wheels are CUDA builds. Beside a CPU torch their C
extension cannot load, and ``torchvision/_meta_registrations.py`` then fails at import with
"operator torchvision::nms does not exist" — and ``import diffsynth`` imports torchvision, so every
DiffSynth import fails (research/diffsynth_wan22.md §1). The Wan path never uses torchvision ops,
so on a CPU-only torch we register an empty module under that name before torchvision loads.
On CUDA torch the real module is left alone.

DiffSynth's package initialisers: ``import diffsynth`` runs ``diffsynth/__init__`` and
``diffsynth/core/__init__``, which import every part of the library: its attention module calls
``torch.compile`` at import (Dynamo and Inductor), its loader imports transformers, its VRAM maps
every model. That is 4-5 s of CPU in every process that builds a GcDiT or a VAE (each rank of each
launched job) for two model files that need none of it. ``import_diffsynth`` registers those
packages without running their initialisers; the first attribute read from one (``import
diffsynth; diffsynth.ModelConfig``, ``from diffsynth.core import ...``) runs it, so code that uses
the rest of DiffSynth sees the whole library as before.

DeepSpeed's accelerator: DiffSynth's gradient checkpointing imports DeepSpeed, whose auto-detection
prints "Setting accelerator to CPU" as a warning in every process without CUDA (each rank of each
job, and the Dagster process that draws a preview). ``name_the_deepspeed_accelerator`` says "cpu"
before that, where CUDA is absent; an explicit DS_ACCELERATOR is kept.

FlashAttention-2 probe: DiffSynth's Wan DiT takes its FA2 branch when ``import flash_attn``
succeeds, but flash-attn-4 (our optional ``attn_backend: fa4``) installs a package of that name
without ``flash_attn_func``, so every DiffSynth Wan attention then fails with AttributeError (seen
on the H200, 2026-11-30). The probe is corrected to "FA2 present" only when the function exists.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

# the package initialisers that import the whole library; submodules below them load on their own
DEFERRED_PACKAGES = ("diffsynth", "diffsynth.core", "diffsynth.core.loader", "diffsynth.configs")


def patch_torchvision_for_cpu_torch() -> None:
    import torch

    if torch.version.cuda is None and "torchvision" not in sys.modules:
        sys.modules.setdefault(
            "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
        )


def name_the_deepspeed_accelerator() -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def import_diffsynth():
    """DiffSynth offline (no hub downloads) with the torchvision workaround applied: its Wan DiT file
    loaded, its package initialisers deferred to their first use (``defer_package_init``)."""
    os.environ.setdefault("DIFFSYNTH_SKIP_DOWNLOAD", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    patch_torchvision_for_cpu_torch()
    name_the_deepspeed_accelerator()
    for name in DEFERRED_PACKAGES:
        defer_package_init(name)
    from diffsynth.models import wan_video_dit

    repair_fa2_probe(wan_video_dit)
    return sys.modules["diffsynth"]


def defer_package_init(name: str) -> None:
    """Register package ``name`` with its ``__path__`` (so its submodules import) but without running
    its ``__init__``; the first attribute read from it that the package does not yet hold runs the
    ``__init__`` (PEP 562 ``__getattr__``). A package already imported is left as it is.

    Written here because importlib's ``LazyLoader`` runs the ``__init__`` at the first attribute
    access of any kind, and importing a submodule reads the parent's ``__path__``."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def finish(attr: str) -> Any:
        del module.__dict__["__getattr__"]
        try:
            loader.exec_module(module)
        except BaseException:
            module.__dict__["__getattr__"] = finish  # a later read tries again, as a re-import would
            raise
        return getattr(module, attr)

    module.__dict__["__getattr__"] = finish
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def repair_fa2_probe(wan_dit: types.ModuleType) -> None:
    """Clear ``wan_dit.FLASH_ATTN_2_AVAILABLE`` when its ``flash_attn`` is not FlashAttention-2."""
    if getattr(wan_dit, "FLASH_ATTN_2_AVAILABLE", False) and not hasattr(
        getattr(wan_dit, "flash_attn", None), "flash_attn_func"
    ):
        setattr(wan_dit, "FLASH_ATTN_2_AVAILABLE", False)  # noqa: B010 (a module attribute mypy cannot see)
