"""Operator commands around the Dagster instance (no daemon needed).

``python -m gc25d_pipeline.cli sync-snapshots``: add a cache_snapshots partition per published
snapshot (what the sensor does) and print the newest.

``python -m gc25d_pipeline.cli learning-signal [SNAPSHOT]``: the SFT teacher's validation on that
snapshot (default the newest): cond / uncond / null-text MSE per validation step and t, and how
far cond is below uncond at the last validation (what ``make run`` prints).

``python -m gc25d_pipeline.cli eval-table [SNAPSHOT]``: the eval asset's comparison table across the
chain's exports on that snapshot (what ``make run`` prints at its end).
"""

import argparse
import sys
from pathlib import Path

import dagster as dg

from gc25d_core.cache.from_layout import open_cache_store
from gc25d_core.cache.manifest import snapshot_id
from gc25d_core.cache.snapshots import list_versions
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.project import default_project


def sync_snapshots(instance: dg.DagsterInstance) -> list[str]:
    """Register every published snapshot as a dynamic partition; returns all snapshot ids, oldest first."""
    keys = [snapshot_id(v) for v in list_versions(open_cache_store(default_project().config()))]
    have = set(instance.get_dynamic_partitions(cache_snapshots.name))
    missing = [k for k in keys if k not in have]
    if missing:
        instance.add_dynamic_partitions(cache_snapshots.name, missing)
    return keys


def learning_signal(snapshot: str | None = None) -> int:
    from gc25d_core.train.previews import learning_signal_report

    cfg = default_project().config()
    snapshot = snapshot or _newest_snapshot(cfg)
    if snapshot is None:
        return 1
    run_dir = Path(cfg.paths.runs_root) / "sft" / snapshot
    report = learning_signal_report(run_dir)
    if report is None:
        print(f"{run_dir}: no validation records (val.jsonl) yet", file=sys.stderr)
        return 1
    print(report)
    return 0


def eval_table(snapshot: str | None = None) -> int:
    """The eval asset's comparison table (table.md of its run folder) for ``snapshot``."""
    cfg = default_project().config()
    snapshot = snapshot or _newest_snapshot(cfg)
    if snapshot is None:
        return 1
    table = Path(cfg.paths.runs_root) / "eval" / snapshot / "table.md"
    if not table.is_file():
        print(f"{table}: not written yet (materialize eval for {snapshot})", file=sys.stderr)
        return 1
    print(f"eval of snapshot {snapshot} ({table.parent / 'report.md'})")
    print(table.read_text())
    return 0


def _newest_snapshot(cfg) -> str | None:
    keys = [snapshot_id(v) for v in list_versions(open_cache_store(cfg))]
    if not keys:
        print("no snapshot published yet", file=sys.stderr)
        return None
    return keys[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gc25d_pipeline.cli")
    ap.add_argument("command", choices=["sync-snapshots", "learning-signal", "eval-table"])
    ap.add_argument(
        "snapshot", nargs="?", default=None, help="learning-signal / eval-table: a snapshot id (default: newest)"
    )
    args = ap.parse_args(argv)
    if args.command == "learning-signal":
        return learning_signal(args.snapshot)
    if args.command == "eval-table":
        return eval_table(args.snapshot)
    with dg.DagsterInstance.get() as instance:
        keys = sync_snapshots(instance)
    if not keys:
        print("no snapshot published yet", file=sys.stderr)
        return 1
    print(keys[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
