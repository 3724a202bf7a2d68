"""Operator commands around the Dagster instance (no daemon needed).

``python -m gc25d_pipeline.cli sync-snapshots``: add a cache_snapshots partition per published
snapshot (what the sensor does) and print the newest.

``python -m gc25d_pipeline.cli learning-signal [SNAPSHOT]``: the SFT teacher's validation on that
snapshot (default the newest): cond / uncond / null-text MSE per validation step and t, and how
far cond is below uncond at the last validation (what ``make run`` prints).

``python -m gc25d_pipeline.cli eval-table [SNAPSHOT]``: the eval asset's comparison table across the
chain's exports on that snapshot (what ``make run`` prints at its end).

``python -m gc25d_pipeline.cli timeline [--since UNIX_TIME]``: the runs created since then (default:
the last hour), oldest first, each with its wall time and its steps' (what ``make run`` prints last,
from its own start).

``python -m gc25d_pipeline.cli check-config``: resolve the project's config (GC25D_PRESET,
GC25D_OVERRIDES) and print its roots, or the one line saying which preset, override or field is
wrong (exit 2) — what Dagster would otherwise report inside its definitions-loading tracebacks.

A config error of any command is printed as that one line (exit 2), without a traceback.

``python -m gc25d_pipeline.cli launch JOB [PARTITION] [--config-json JSON]``: queue a run of JOB on the
instance (what ``dagster job launch`` does, which prints nothing) and print its run id; the daemon
of ``dg dev`` / ``make dev`` on the same DAGSTER_HOME starts it. A partition must exist already.
"""

import argparse
import sys
from pathlib import Path

import dagster as dg

from gc25d_core.cache.manifest import snapshot_id
from gc25d_core.cache.snapshots import list_versions
from gc25d_core.cache.stores import open_cache_store
from gc25d_core.config import ConfigError
from gc25d_pipeline.defs.cache.partitions import cache_snapshots
from gc25d_pipeline.lib.project import default_project

WORKSPACE = Path(__file__).resolve().parent.parent / "workspace.yaml"


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


def launch(
    instance: dg.DagsterInstance, job: str, partition: str | None, config_json: str | None
) -> dg.DagsterRun:
    """Queue a run of ``job`` from the workspace (location gc25d, as the daemon loads it)."""
    import json

    from dagster._cli.job import execute_launch_command
    from dagster_shared.cli import WorkspaceOpts

    if partition is not None and partition not in instance.get_dynamic_partitions(cache_snapshots.name):
        raise SystemExit(f"partition {partition!r} does not exist (sync-snapshots adds the published ones)")
    tags = {"dagster/partition": partition} if partition else {}
    return execute_launch_command(
        instance=instance,
        workspace_opts=WorkspaceOpts(workspace=[str(WORKSPACE)]),
        job_name=job,
        config_json=config_json,
        tags=json.dumps(tags) if tags else None,
    )


def check_config() -> int:
    project = default_project()
    cfg = project.config()
    print(
        f"preset {project.preset}: data root {cfg.paths.data_root}, runs root {cfg.paths.runs_root}, "
        f"raw {cfg.raw.kind} at {cfg.raw.root}, cache {cfg.cache.store}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except ConfigError as e:  # the message names the preset, override or field: no traceback
        print(f"gc25d: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gc25d_pipeline.cli")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("sync-snapshots", help="add a partition per published snapshot; print the newest")
    sub.add_parser("check-config", help="resolve the project's config; print its roots or what is wrong")
    run = sub.add_parser("launch", help="queue a run of a job; print its run id")
    run.add_argument("job", help="e.g. sft_job")
    run.add_argument("partition", nargs="?", help="snapshot id, e.g. v000001 (partitioned jobs)")
    run.add_argument("--config-json", help="run config as JSON")
    for name, what in (
        ("learning-signal", "the SFT teacher's cond / uncond validation table"),
        ("eval-table", "the eval asset's comparison table across the chain's exports"),
    ):
        sub.add_parser(name, help=what).add_argument(
            "snapshot", nargs="?", default=None, help="a snapshot id (default: the newest)"
        )
    since = sub.add_parser("timeline", help="the runs since a moment and their steps' wall times")
    since.add_argument("--since", type=float, default=None, help="a Unix time (default: an hour ago)")
    args = ap.parse_args(argv)
    if args.command == "timeline":
        import time

        from gc25d_pipeline.lib.timeline import timeline

        with dg.DagsterInstance.get() as instance:
            print(timeline(instance, time.time() - 3600 if args.since is None else args.since))
        return 0
    if args.command == "check-config":
        return check_config()
    if args.command == "learning-signal":
        return learning_signal(args.snapshot)
    if args.command == "eval-table":
        return eval_table(args.snapshot)
    if args.command == "launch":
        with dg.DagsterInstance.get() as instance:
            queued = launch(instance, args.job, args.partition, args.config_json)
        print(queued.run_id)  # stdout: the id alone, for scripts
        what = f"{args.job} [{args.partition}]" if args.partition else args.job
        print(f"queued {what} as run {queued.run_id}; the daemon of dg dev starts it", file=sys.stderr)
        return 0
    with dg.DagsterInstance.get() as instance:
        keys = sync_snapshots(instance)
    if not keys:
        print("no snapshot published yet", file=sys.stderr)
        return 1
    print(keys[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
