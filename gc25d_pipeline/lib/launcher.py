"""What every job launcher shares: the interface heavy assets call, the torchrun arguments, the rank
errors torchrun leaves, and Pipes over a shared filesystem.

Assets take a ``JobLauncher`` (resource key ``torchrun``) and call ``launch``; which subclass is bound
is configuration (``gc25d_pipeline.lib.launchers.launcher_from_env``):

- ``TorchrunLauncher`` (lib/torchrun.py): torchrun as a child of the Dagster step, one node or several
  joined by a c10d rendezvous;
- ``SlurmLauncher`` (lib/slurm.py): ``sbatch``, one task per node, torchrun inside;
- ``KubernetesLauncher`` (lib/k8s.py): an Indexed Job plus a headless Service.

Every launcher runs the same ``python -m gc25d_core.lifeline ... -m gc25d_core.jobs.<stage> --config
<run_dir>/config.yaml --run-dir <run_dir>`` command, so a job behaves the same wherever it runs.

When the ranks may run on other machines than the Dagster step, Pipes cannot use its default local
temp files: the context and the messages go through two files in ``<run_dir>/pipes/attempt-NN/``
(``PipesFileContextInjector`` / ``PipesFileMessageReader``), which needs ``run_dir`` on a filesystem
that the step and every node share. Whichever node ends up holding global rank 0 (c10d assigns group
ranks by sorted node address, not by ``--node-rank``) reports; the other ranks stay silent.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_param
from pydantic import Field, field_validator

from gc25d_core.config import Gc25dConfig, write_resolved

Context = dg.AssetExecutionContext | dg.OpExecutionContext

# Secondary failures: a rank that lost its peer reports this, not the root cause.
_PEER_LOSS_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL",
    "Broken pipe",
    "SIGTERM",
    "SIGINT",
)
_NODE_DIR = re.compile(r"^node-(\d+)$")
# What a POSIX shell accepts as a variable name: the launchers write ``export NAME=...`` lines.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Errors of the job's inputs (config, names, manifests, weights, hand-offs): the same on every attempt,
# so the step fails at once instead of retrying for minutes. torchrun's error.json message is
# "<ExceptionType>: <text>".
PERMANENT_ERRORS = (
    "ConfigError",
    "InvalidNameError",
    "ManifestError",
    "SampleSchemaError",
    "WeightsError",
    "ExportError",
    "PickError",
)


def summary_metadata(summary: dict[str, Any]) -> dict[str, Any]:
    """A job's recorded summary as the asset's own metadata, for a step that launches nothing (what
    the job's Pipes report would carry): nested values as JSON, None left out."""
    return {
        k: dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v
        for k, v in summary.items()
        if v is not None
    }


@dataclass(frozen=True)
class RankError:
    local_rank: int
    message: str
    traceback: str
    timestamp: int
    node: int = 0  # the agent's node-<n> log folder (0 on one node)

    @property
    def is_peer_loss(self) -> bool:
        return any(m in self.message for m in _PEER_LOSS_MARKERS)

    @property
    def is_permanent(self) -> bool:
        return self.message.split(":", 1)[0].strip() in PERMANENT_ERRORS

    @property
    def where(self) -> str:
        return f"node {self.node} local rank {self.local_rank}"


def read_rank_errors(log_dir: Path) -> list[RankError]:
    """Every ``error.json`` torchrun left under ``log_dir`` (``[node-<n>/]<run>/attempt_*/<local_rank>/``),
    root cause first: peer-loss errors last, then the earliest."""
    errors = []
    for path in sorted(log_dir.glob("**/attempt_*/*/error.json")):
        node_match = next((m for p in path.parents if (m := _NODE_DIR.match(p.name))), None)
        node = int(node_match.group(1)) if node_match else 0
        local = int(path.parent.name) if path.parent.name.isdigit() else -1
        try:
            msg = json.loads(path.read_text())["message"]
            if isinstance(msg, str):
                msg = {"message": msg, "extraInfo": {}}
            extra = msg.get("extraInfo", {})
            errors.append(
                RankError(
                    local_rank=local,
                    message=str(msg.get("message", "")),
                    traceback=str(extra.get("py_callstack", "")),
                    timestamp=int(extra.get("timestamp", 0) or 0),
                    node=node,
                )
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            errors.append(RankError(local, f"unreadable error file {path}", "", 0, node))
    return sorted(errors, key=lambda e: (e.is_peer_loss, e.timestamp, e.node, e.local_rank))


def rank_failure(
    context: Context,
    module: str,
    log_dir: Path,
    headline: str,
    metadata: dict[str, Any] | None = None,
) -> dg.Failure:
    """A step failure naming the failing rank's error (all of them in the run log), or ``headline``
    alone when no rank left an error file (killed, cancelled before start, lost node)."""
    errors = read_rank_errors(log_dir)
    md: dict[str, Any] = {"torchrun_log_dir": dg.MetadataValue.path(str(log_dir)), **(metadata or {})}
    if not errors:
        context.log.error(f"{module}: {headline}; no rank left an error file in {log_dir}")
        return dg.Failure(description=f"{module}: {headline}; see {log_dir}", metadata=md)
    for err in errors:
        context.log.error(f"{module}: {err.where} failed: {err.message}\n{err.traceback}")
    root = errors[0]
    md["failed_ranks"] = dg.MetadataValue.json([err.where for err in errors])
    md["failed_local_ranks"] = dg.MetadataValue.json([err.local_rank for err in errors])
    md["root_cause_traceback"] = dg.MetadataValue.md(f"```\n{root.traceback}\n```")
    if root.is_peer_loss and not headline.startswith("torchrun"):
        # every rank only lost its peers: the scheduler's verdict (cancelled, timed out) is the cause
        desc = f"{module}: {headline}; {root.where}: {root.message}"
    else:
        desc = f"{module}: {root.where} failed: {root.message}"
        if not headline.startswith("torchrun"):
            desc += f" ({headline})"
    if root.is_permanent:
        desc += " (not retried: the same inputs fail the same way on every attempt)"
    return dg.Failure(description=desc, metadata=md, allow_retries=not root.is_permanent)


@dataclass(frozen=True)
class PreparedLaunch:
    """The files of one launch attempt in the run folder."""

    run_dir: Path
    config_path: Path
    log_dir: Path  # torchrun --log-dir of node n is log_dir/node-<n>
    pipes_dir: Path
    job_args: list[str]  # --config ... --run-dir ... and the asset's own arguments

    @property
    def context_path(self) -> Path:
        return self.pipes_dir / "context.json"

    @property
    def messages_path(self) -> Path:
        return self.pipes_dir / "messages.jsonl"


def shared_fs_bootstrap_env(launch: PreparedLaunch) -> dict[str, str]:
    """The Pipes bootstrap variables of a session over ``launch``'s two files: what
    ``PipesFileContextInjector`` / ``PipesFileMessageReader`` yield as their params,
    encoded as ``PipesSession.get_bootstrap_env_vars`` does. Computed here because a peer node's
    command must be written before the local torchrun starts (tests/test_multinode.py checks it
    against a real session)."""
    return {
        DAGSTER_PIPES_CONTEXT_ENV_VAR: encode_param({"path": str(launch.context_path)}),
        DAGSTER_PIPES_MESSAGES_ENV_VAR: encode_param(
            {"path": str(launch.messages_path), "include_stdio_in_messages": False}
        ),
    }


def shared_fs_pipes(launch: PreparedLaunch) -> dict[str, Any]:
    """Pipes' ``context_injector`` and ``message_reader`` over ``launch``'s two files, for
    ``dg.open_pipes_session`` or a Pipes client."""
    return {
        "context_injector": dg.PipesFileContextInjector(str(launch.context_path)),
        "message_reader": dg.PipesFileMessageReader(str(launch.messages_path)),
    }


class JobLauncher(dg.ConfigurableResource):
    """How heavy assets start their torchrun jobs; subclasses decide where the ranks run."""

    nproc_per_node: int = Field(default=1, ge=1, description="ranks per node (GPUs per node in production)")
    nnodes: int = Field(default=1, ge=1, description="nodes (torchrun agents) joined by one rendezvous")
    max_restarts: int = Field(
        default=0, ge=0, description="torchrun-internal restarts (Dagster retries are preferred)"
    )
    python: str = Field(default=sys.executable, description="interpreter that runs torchrun and the ranks")
    extra_env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables every rank gets on top of the launcher's; names are shell "
        "variable names ([A-Za-z_][A-Za-z0-9_]*), values any text (quoted where they enter a script)",
    )

    @field_validator("extra_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"variable name {name!r} is not a shell variable name ({ENV_NAME.pattern})")
            if "\0" in value:
                raise ValueError(f"variable {name}: a value cannot hold a NUL character")
        return env

    @field_validator("python")
    @classmethod
    def _python(cls, python: str) -> str:
        if not python or any(c in python for c in "\0\n\r"):
            raise ValueError(f"{python!r} is not an interpreter path")
        return python

    def launch(
        self,
        context: Context,
        module: str,
        cfg: Gc25dConfig,
        run_dir: Path,
        args: list[str] | None = None,
        extras: dict[str, Any] | None = None,
    ) -> dg.PipesClientCompletedInvocation:
        """Write the resolved config into ``run_dir``, run the job, fail with the failing rank's error."""
        self.before_launch(context, run_dir)
        launch = self.prepare(context, cfg, run_dir, args or [])
        return self.run_job(context, module, launch, {"run_dir": str(run_dir), **(extras or {})})

    # --- what the subclasses decide --------------------------------------------------------------

    def before_launch(self, context: Context, run_dir: Path) -> None:
        """Refuse the launch, or clean up after an earlier one, before this attempt writes anything."""

    def run_job(
        self, context: Context, module: str, launch: PreparedLaunch, extras: dict[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        """Run ``module`` on the prepared files; ``extras`` go to the Pipes session."""
        raise NotImplementedError(f"{type(self).__name__} does not launch jobs")

    # --- shared by the subclasses ----------------------------------------------------------------

    @staticmethod
    def prepare(context: Context, cfg: Gc25dConfig, run_dir: Path, args: Sequence[str]) -> PreparedLaunch:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path = write_resolved(cfg, run_dir)
        attempt = f"attempt-{context.retry_number:02d}"
        pipes_dir = run_dir / "pipes" / attempt
        pipes_dir.mkdir(parents=True, exist_ok=True)
        return PreparedLaunch(
            run_dir=run_dir,
            config_path=config_path,
            log_dir=run_dir / "torchrun_logs" / attempt,
            pipes_dir=pipes_dir,
            job_args=["--config", str(config_path), "--run-dir", str(run_dir), *args],
        )

    def job_env(self, retry_number: int) -> dict[str, str]:
        """What every rank's environment needs, on any node."""
        env = {
            "PYTHONUNBUFFERED": "1",
            "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off (device README)
            "GC25D_RETRY_NUMBER": str(retry_number),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        if self.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
            # torchrun's own default for several ranks a node, said here so that torchrun does not
            # print its four-line banner about setting it at every launch. A CPU run's digits
            # depend on it (one intra-op thread a rank: gc25d_core.train.sft).
            env["OMP_NUM_THREADS"] = "1"
        env.update(self.extra_env)
        return env

    def torchrun_args(
        self,
        module: str,
        job_args: Sequence[str],
        log_dir: Path | str,
        *,
        node_rank: str,
        rdzv_endpoint: str | None,
        rdzv_id: str,
        rdzv_conf: str | None = None,
    ) -> list[str]:
        """``-m gc25d_core.lifeline`` arguments: --standalone on one node without an endpoint, else a
        c10d rendezvous. ``node_rank`` may be a shell expression ($SLURM_NODEID) for a job script."""
        args = ["-m", "gc25d_core.lifeline"]  # torchrun, bound to its parent (gc25d_core.lifeline)
        if self.nnodes == 1 and rdzv_endpoint is None:
            args.append("--standalone")
        else:
            if not rdzv_endpoint:
                raise dg.Failure(f"{type(self).__name__}: multi-node torchrun needs a rendezvous endpoint")
            args += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
            if rdzv_conf:
                args.append(f"--rdzv-conf={rdzv_conf}")
            args.append(f"--node-rank={node_rank}")
        return [
            *args,
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            f"--max-restarts={self.max_restarts}",
            f"--log-dir={log_dir}/node-{node_rank}",
            "-m",
            module,
            *job_args,
        ]


def shell_join(args: Sequence[str], variables: dict[str, str] | None = None) -> str:
    """``args`` as one shell command line; each placeholder key in ``variables`` becomes a quoted
    expansion of the shell variable it maps to (``{"@NODE@": "SLURM_NODEID"}``), inside or outside
    the argument's own quoting."""
    variables = variables or {}
    out = []
    for arg in args:
        quoted = shlex.quote(arg)
        for placeholder, var in variables.items():
            if placeholder in arg:
                inside = quoted.startswith("'")  # close the single quotes around the expansion
                quoted = quoted.replace(placeholder, f"'\"${{{var}}}\"'" if inside else f'"${{{var}}}"')
        out.append(quoted)
    return " ".join(out)
