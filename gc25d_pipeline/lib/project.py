"""The project resource: which preset, where artifacts and the raw dataset live.

Every asset resolves one ``Gc25dConfig`` from it (defaults < preset YAML < overrides < the store
and raw-dataset settings below), so Dagster and plain ``torchrun`` runs read the same typed config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from gc25d_core.config import Gc25dConfig, deep_merge, load_config, parse_overrides
from gc25d_core.names import InvalidNameError, path_under


class ArtifactStore(dg.ConfigurableResource):
    """Where processed data and run folders go; None keeps the preset's paths."""

    data_root: str | None = Field(
        default=None, description="processed data (SPEC §5 layout); None: the preset's paths.data_root"
    )
    runs_root: str | None = Field(
        default=None, description="run folders <stage>/<partition>/; None: the preset's paths.runs_root"
    )


class RawDataset(dg.ConfigurableResource):
    """The raw dataset the graph reads: the built-in code world (generated) or a real v10 snapshot."""

    kind: str | None = Field(default=None, description="'codeworld' or 'v10'; None keeps the preset's")
    root: str | None = Field(
        default=None, description="the raw snapshot's folder; None: the preset's raw.root"
    )


class Gc25dProject(dg.ConfigurableResource):
    """The run config every asset resolves: defaults < configs/<preset>.yaml < overrides < store / raw
    (GC25D_PRESET, GC25D_OVERRIDES)."""

    preset: str = Field(default="tiny", description="configs/<preset>.yaml or a path to a YAML file")
    overrides: list[str] = Field(
        default_factory=list, description="dotted key=value overrides, e.g. paths.data_root=/nvme/gc25d"
    )
    store: ArtifactStore = Field(default_factory=ArtifactStore, description="where data and run folders go")
    raw: RawDataset = Field(default_factory=RawDataset, description="the raw dataset the graph reads")

    def config(self) -> Gc25dConfig:
        tree: dict[str, Any] = parse_overrides(self.overrides)
        paths = {
            k: v for k, v in (("data_root", self.store.data_root), ("runs_root", self.store.runs_root)) if v
        }
        raw = {k: v for k, v in (("kind", self.raw.kind), ("root", self.raw.root)) if v}
        tree = deep_merge(tree, {"paths": paths, "raw": raw})
        return load_config(self.preset, tree)

    def run_dir(
        self,
        cfg: Gc25dConfig,
        stage: str,
        context: dg.AssetExecutionContext | None = None,
        per_run: bool = False,
    ) -> Path:
        """Deterministic per (stage, partition): retries and relaunches resume from the same folder.

        ``per_run`` adds the run id, so only retries inside one run resume (for checks that must
        really run again on every new run). The stage, the partition key and the run id must each be
        a name (gc25d_core.names) and the folder must stay under the runs root: a bad key fails the
        step without retries (a retry cannot fix it)."""
        part = context.partition_key if context is not None and context.has_partition_key else "default"
        try:
            path = path_under(path_under(cfg.paths.runs_root, stage, "stage"), part, "partition key")
            if per_run and context is not None:
                path = path_under(path, context.run.run_id, "run id")
        except InvalidNameError as e:
            raise dg.Failure(f"run folder of {stage!r}: {e}", allow_retries=False) from None
        # absolute (not resolved: a checked folder stays as named), so metadata and logs name it fully
        return Path(os.path.abspath(path))


def default_project() -> Gc25dProject:
    """The project for this code location: GC25D_PRESET (default 'tiny') and GC25D_OVERRIDES (';'-separated)."""
    overrides = [o for o in os.environ.get("GC25D_OVERRIDES", "").split(";") if o.strip()]
    return Gc25dProject(preset=os.environ.get("GC25D_PRESET", "tiny"), overrides=overrides)
