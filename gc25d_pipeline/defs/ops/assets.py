"""Operational assets: the distributed health check that proves the torchrun path end to end."""

import dagster as dg

from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.project import Gc25dProject


class ClusterCheckConfig(dg.Config):
    steps: int = 6
    step_seconds: float = 0.0
    fresh: bool = False


@dg.asset(
    group_name="ops",
    kinds={"torch"},
    pool="gpu",
    retry_policy=dg.RetryPolicy(max_retries=2, delay=1),
)
def cluster_check(
    context: dg.AssetExecutionContext,
    config: ClusterCheckConfig,
    project: Gc25dProject,
    torchrun: JobLauncher,
) -> dg.MaterializeResult:
    """All ranks join, all-reduce and checkpoint each step; a retry within the run resumes from its folder."""
    cfg = project.config()
    args = ["--steps", str(config.steps), "--step-seconds", str(config.step_seconds)]
    if config.fresh:
        args.append("--fresh")
    run_dir = project.run_dir(cfg, "cluster_check", context, per_run=True)
    return torchrun.launch(
        context, "gc25d_core.jobs.cluster_check", cfg, run_dir, args
    ).get_materialize_result()
