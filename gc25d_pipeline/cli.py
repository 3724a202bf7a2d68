"""Operator commands around the Dagster instance (no daemon needed).

``python -m gc25d_pipeline.cli sync-snapshots``: add a cache_snapshots partition per published
snapshot (what the sensor does) and print the newest.

``python -m gc25d_pipeline.cli launch JOB [PARTITION] [--config-json JSON]``: queue a run of JOB on the
instance (what ``dagster job launch`` does, which prints nothing) and print its run id; the daemon
of ``dg dev`` / ``make dev`` on the same DAGSTER_HOME starts it. A partition must exist already.
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

WORKSPACE = Path(__file__).resolve().parent.parent / "workspace.yaml"


def sync_snapshots(instance: dg.DagsterInstance) -> list[str]:
    """Register every published snapshot as a dynamic partition; returns all snapshot ids, oldest first."""
    keys = [snapshot_id(v) for v in list_versions(open_cache_store(default_project().config()))]
    have = set(instance.get_dynamic_partitions(cache_snapshots.name))
    missing = [k for k in keys if k not in have]
    if missing:
        instance.add_dynamic_partitions(cache_snapshots.name, missing)
    return keys


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gc25d_pipeline.cli")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("sync-snapshots", help="add a partition per published snapshot; print the newest")
    run = sub.add_parser("launch", help="queue a run of a job; print its run id")
    run.add_argument("job", help="e.g. sft_job")
    run.add_argument("partition", nargs="?", help="snapshot id, e.g. v000001 (partitioned jobs)")
    run.add_argument("--config-json", help="run config as JSON")
    args = ap.parse_args(argv)
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
