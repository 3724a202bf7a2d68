"""Operational assets: the distributed health check that proves the torchrun path end to end."""

import dagster as dg
from pydantic import Field

from gc25d_pipeline.lib.launcher import JobLauncher
from gc25d_pipeline.lib.project import Gc25dProject


class ClusterCheckConfig(dg.Config):
    steps: int = Field(default=6, ge=1, description="all-reduce + checkpoint steps")
    step_seconds: float = Field(
        default=0.0, ge=0, description="sleep per step (a long check to kill or terminate in tests)"
    )
    fresh: bool = Field(default=False, description="ignore this run's checkpoints and start at step 0")


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
