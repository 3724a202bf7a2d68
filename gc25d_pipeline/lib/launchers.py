"""Which launcher the code location binds to the ``torchrun`` resource key, from configuration.

``GC25D_LAUNCHER_CONFIG`` names a YAML file: ``kind`` (torchrun | slurm | kubernetes) and that
launcher's fields, e.g.

    kind: slurm
    nnodes: 2
    nproc_per_node: 8
    partition: h200
    time_limit: "7-00:00:00"

Unset, the embedded default: a one-node ``TorchrunLauncher`` with the preset's
``distributed.nproc_per_node`` / ``nnodes``. Fields the file leaves out keep those defaults too.
Nothing here imports a scheduler's client: the Kubernetes client is imported only when a job is
submitted, and Slurm is reached through its command-line tools.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import yaml

from gc25d_core.config import Gc25dConfig
from gc25d_core.schema import ConfigError
from gc25d_pipeline.lib.k8s import KubernetesLauncher
from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.slurm import SlurmLauncher
from gc25d_pipeline.lib.torchrun import TorchrunLauncher

CONFIG_ENV = "GC25D_LAUNCHER_CONFIG"
KINDS: dict[str, type[JobLauncher]] = {
    "torchrun": TorchrunLauncher,
    "slurm": SlurmLauncher,
    "kubernetes": KubernetesLauncher,
}


def load_launcher(path: Path, cfg: Gc25dConfig) -> JobLauncher:
    """The launcher ``path`` describes; errors name the file and the field."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the launcher config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'kind' and the launcher's fields")
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(f"{path}: field 'kind' is {kind!r}; expected one of {sorted(KINDS)}")
    cls = KINDS[kind]
    unknown = sorted(set(data) - set(cls.model_fields))
    if unknown:
        raise ConfigError(
            f"{path}: unknown field(s) {unknown} for kind {kind!r} (known: {sorted(cls.model_fields)})"
        )
    fields = {"nproc_per_node": cfg.distributed.nproc_per_node, "nnodes": cfg.distributed.nnodes, **data}
    try:
        return cls(**fields)
    except pydantic.ValidationError as e:
        where = "; ".join(f"field {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{path}: {where}") from None


def launcher_from_env(cfg: Gc25dConfig) -> JobLauncher:
    raw = os.environ.get(CONFIG_ENV, "").strip()
    if raw:
        return load_launcher(Path(raw), cfg)
    return TorchrunLauncher(nproc_per_node=cfg.distributed.nproc_per_node, nnodes=cfg.distributed.nnodes)
