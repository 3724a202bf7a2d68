"""Deploy fixtures: the tiny preset (a seeded tiny VAE, the synthetic text table) and a tiny causal
export with the deploy attention (sink 3 / window 17 / cap 20) and the 4-step axis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gc25d_core.compat import import_diffsynth
from gc25d_core.config import Gc25dConfig, load_config

import_diffsynth()


def tiny_deploy_cfg(root: Path) -> Gc25dConfig:
    return load_config(
        "tiny",
        {
            "paths": {"data_root": str(root / "data"), "runs_root": str(root / "runs")},
            "raw": {"root": str(root / "raw")},
            # no fitted VAE in a test: the seeded tiny random one (same class, same code paths)
            "vae": {"fit": {"enabled": False}},
        },
    )


def write_tiny_export(
    path: Path, seed: int = 0, causal: bool = True, vocab: str = "parts", **extra: str
) -> Path:
    from gc25d_core.flow import DEPLOY_AXIS
    from gc25d_core.models.configs import DEPLOY_CAUSAL, tiny_config
    from gc25d_core.models.export import save_export
    from gc25d_core.models.gcdit import GcDiT

    torch.manual_seed(seed)
    model = GcDiT(tiny_config(vocab=vocab)).eval()
    with torch.no_grad():  # a live condition encoder: ids must move the picture
        torch.nn.init.normal_(model.gc_sem_cond.proj_out.weight, std=0.5)
        torch.nn.init.normal_(model.gc_sem_cond.proj_out.bias, std=0.2)
    return save_export(
        path,
        model,
        vocab=vocab,  # type: ignore[arg-type]
        causal=DEPLOY_CAUSAL if causal else None,
        denoise_axis=DEPLOY_AXIS.timesteps if causal else None,
        extra={"stage": "stage3_dmd", "step": "5", **extra},
    )


@pytest.fixture(scope="session")
def deploy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy")


@pytest.fixture(scope="session")
def deploy_cfg(deploy_root: Path) -> Gc25dConfig:
    return tiny_deploy_cfg(deploy_root)


@pytest.fixture(scope="session")
def tiny_export(deploy_root: Path) -> Path:
    return write_tiny_export(deploy_root / "exports" / "tiny_causal.safetensors")


@pytest.fixture(autouse=True)
def _one_thread():
    """Two cores shared with other engineers: keep torch to one thread in these tests."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
