"""The project resource: which preset, where artifacts and the raw dataset live.

Every asset resolves one ``Gc25dConfig`` from it (defaults < preset YAML < overrides < the store
and raw-dataset settings below), so Dagster and plain ``torchrun`` runs read the same typed config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import (
    ConfigError,
    Gc25dConfig,
    check_given_roots,
    deep_merge,
    load_config,
    override_origins,
    parse_overrides,
)
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
        """The resolved config; fails at once (ConfigError, one line naming the override or field)
        on an invalid value, a data root the user gave that holds nothing (``check_given_roots``),
        or a runs root that belongs to another data root (``check_runs_root``)."""
        tree: dict[str, Any] = parse_overrides(self.overrides)
        origins = {
            k: f"{v} (GC25D_OVERRIDES / project.overrides)"
            for k, v in override_origins(self.overrides).items()
        }
        paths = {
            k: v for k, v in (("data_root", self.store.data_root), ("runs_root", self.store.runs_root)) if v
        }
        raw = {k: v for k, v in (("kind", self.raw.kind), ("root", self.raw.root)) if v}
        origins |= {f"paths.{k}": f"store.{k}={v} (project resource)" for k, v in paths.items()}
        origins |= {f"raw.{k}": f"raw.{k}={v} (project resource)" for k, v in raw.items()}
        tree = deep_merge(tree, {"paths": paths, "raw": raw})
        cfg = load_config(self.preset, tree, origins=origins)
        check_given_roots(cfg, {k: v for k, v in origins.items() if k in ("paths.data_root", "raw.root")})
        check_runs_root(cfg)
        return cfg

    def stage_overrides(self, stage: str) -> dict[str, Any]:
        """The overrides of ``stage``'s section (``sft.max_steps=500`` → ``{"max_steps": 500}``): the
        stage asset merges them over the stage preset it runs (``load_config`` checks them over the
        project preset's)."""
        return parse_overrides(self.overrides).get(stage) or {}

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
        claim_runs_root(cfg)
        # absolute (not resolved: a checked folder stays as named), so metadata and logs name it fully
        return Path(os.path.abspath(path))


# The runs root records the data root its run folders were made from, and a config with another
# data root is refused: run folders are named by stage and partition only (outputs/tiny/sft/default),
# so two data roots sharing a runs root would overwrite each other's folders. Recording beats
# deriving the runs root from the data root: the folder names users read in the README stay as they
# are, and the check is one small file. The data root is kept both absolute and relative to the
# runs root, so a runs root moved alone, or moved together with its data (a copied checkout), still
# matches.
RUNS_ROOT_RECORD = "data_root.json"


def _data_root_record(cfg: Gc25dConfig) -> dict[str, str]:
    runs, data = Path(os.path.abspath(cfg.paths.runs_root)), Path(os.path.abspath(cfg.paths.data_root))
    return {"data_root": str(data), "data_root_from_runs_root": os.path.relpath(data, runs)}


def check_runs_root(cfg: Gc25dConfig) -> None:
    """Refuse a runs root whose record names another data root (ConfigError naming both fields)."""
    record = Path(cfg.paths.runs_root) / RUNS_ROOT_RECORD
    if not record.is_file():
        return
    try:
        had = json.loads(record.read_text())
        recorded, relative = Path(had["data_root"]), str(had["data_root_from_runs_root"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{record}: unreadable record of the runs root's data root ({e})") from None
    now = _data_root_record(cfg)
    runs = Path(os.path.abspath(cfg.paths.runs_root))
    if Path(now["data_root"]) in (recorded, Path(os.path.normpath(runs / relative))):
        return
    raise ConfigError(
        f"paths.data_root {cfg.paths.data_root}: paths.runs_root {cfg.paths.runs_root} holds the run folders "
        f"of data root {recorded} ({record}); give this data root a runs root of its own (paths.runs_root)"
    )


def claim_runs_root(cfg: Gc25dConfig) -> None:
    """Record the data root in a runs root that has no record yet (the first run folder asked for)."""
    record = Path(cfg.paths.runs_root) / RUNS_ROOT_RECORD
    if not record.is_file():
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps(_data_root_record(cfg), indent=1) + "\n")


def default_project() -> Gc25dProject:
    """The project for this code location: GC25D_PRESET (default 'tiny') and GC25D_OVERRIDES (';'-separated)."""
    overrides = [o for o in os.environ.get("GC25D_OVERRIDES", "").split(";") if o.strip()]
    return Gc25dProject(preset=os.environ.get("GC25D_PRESET", "tiny"), overrides=overrides)
