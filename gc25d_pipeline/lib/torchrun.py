"""TorchrunLauncher: a Dagster resource that runs torchrun (``python -m gc25d_core.lifeline``, which
runs torch.distributed.run in-process) on ``-m <module>`` through Dagster Pipes.

- The child's global rank 0 opens Pipes (gc25d_core.report); the other ranks stay silent.
- Termination of the Dagster run is forwarded to torchrun (SIGINT), which stops every rank.
- ``--log-dir`` makes torchrun keep one ``error.json`` per failed rank (written by the job's
  ``@record`` wrapper); on failure the launcher reads them and fails the step with the failing
  rank's error and traceback, so the cause is in the run log, not only in the compute logs.
- GC25D_RETRY_NUMBER tells the job which attempt it is; resume itself lives in the job's run folder.
- Nothing outlives its parent (gc25d_core.lifeline): torchrun is SIGKILLed by the kernel when this
  step process dies, each rank when torchrun dies. Every process of a launch records itself in
  ``<run_dir>/.lifeline``; before launching, survivors of an earlier launch there are killed, and a
  folder owned by another live launcher is refused.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterPipesExecutionError
from pydantic import Field

from gc25d_core.config import Gc25dConfig, write_resolved
from gc25d_core.lifeline import DIR_ENV, PARENT_ENV, RunFolderBusy, lifeline_dir, reap_and_claim

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


@dataclass(frozen=True)
class RankError:
    local_rank: int
    message: str
    traceback: str
    timestamp: int

    @property
    def is_peer_loss(self) -> bool:
        return any(m in self.message for m in _PEER_LOSS_MARKERS)


def read_rank_errors(log_dir: Path) -> list[RankError]:
    """Every ``<log_dir>/<run>/attempt_*/<local_rank>/error.json`` torchrun left, root cause first."""
    errors = []
    for path in sorted(log_dir.glob("*/attempt_*/*/error.json")):
        try:
            msg = json.loads(path.read_text())["message"]
            if isinstance(msg, str):
                msg = {"message": msg, "extraInfo": {}}
            extra = msg.get("extraInfo", {})
            errors.append(
                RankError(
                    local_rank=int(path.parent.name),
                    message=str(msg.get("message", "")),
                    traceback=str(extra.get("py_callstack", "")),
                    timestamp=int(extra.get("timestamp", 0) or 0),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            errors.append(RankError(int(path.parent.name), f"unreadable error file {path}", "", 0))
    return sorted(errors, key=lambda e: (e.is_peer_loss, e.timestamp, e.local_rank))


class TorchrunLauncher(dg.ConfigurableResource):
    """How heavy assets start their torchrun jobs (one node by default; multi-node via rendezvous)."""

    nproc_per_node: int = Field(default=1, description="ranks per node (GPUs per node in production)")
    nnodes: int = Field(default=1)
    node_rank: int = Field(default=0, description="must be 0 here: global rank 0 reports through Pipes")
    rdzv_endpoint: str | None = Field(
        default=None, description="host:port for multi-node; None = --standalone"
    )
    rdzv_backend: str = "c10d"
    max_restarts: int = Field(
        default=0, description="torchrun-internal restarts (Dagster retries are preferred)"
    )
    python: str = Field(default=sys.executable, description="interpreter that runs torchrun and the ranks")
    extra_env: dict[str, str] = Field(default_factory=dict)
    termination_timeout_s: float = 20.0

    def command(self, module: str, args: list[str], log_dir: Path) -> list[str]:
        cmd = [self.python, "-m", "gc25d_core.lifeline"]  # torchrun, bound to this process
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            cmd.append("--standalone")
        else:
            if not self.rdzv_endpoint:
                raise dg.DagsterInvalidConfigError("multi-node torchrun needs rdzv_endpoint", [], None)
            cmd += [
                f"--rdzv-backend={self.rdzv_backend}",
                f"--rdzv-endpoint={self.rdzv_endpoint}",
                f"--node-rank={self.node_rank}",
            ]
        cmd += [
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            f"--max-restarts={self.max_restarts}",
            f"--log-dir={log_dir}",
            "-m",
            module,
            *args,
        ]
        return cmd

    def child_env(self, retry_number: int, run_dir: Path) -> dict[str, str]:
        env = {
            "PYTHONUNBUFFERED": "1",
            "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off (device README)
            "GC25D_RETRY_NUMBER": str(retry_number),
            PARENT_ENV: str(os.getpid()),  # Pipes' Popen runs in this process: torchrun dies with it
            DIR_ENV: str(lifeline_dir(run_dir.resolve())),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        env.update(self.extra_env)
        return env

    def launch(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        module: str,
        cfg: Gc25dConfig,
        run_dir: Path,
        args: list[str] | None = None,
        extras: dict[str, Any] | None = None,
    ) -> dg.PipesClientCompletedInvocation:
        """Write the resolved config into ``run_dir`` and run the job; fail with the rank's error."""
        if self.node_rank != 0:
            raise dg.Failure(
                "TorchrunLauncher must run on node_rank 0 (the Pipes reader is local to this step)"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        self._reap_leftovers(context, run_dir)
        config_path = write_resolved(cfg, run_dir)
        retry = context.retry_number
        log_dir = run_dir / "torchrun_logs" / f"attempt-{retry:02d}"
        command = self.command(
            module, ["--config", str(config_path), "--run-dir", str(run_dir), *(args or [])], log_dir
        )
        context.log.info(f"launching {self.nnodes}x{self.nproc_per_node} ranks: {' '.join(command)}")
        client = dg.PipesSubprocessClient(
            env={**os.environ, **self.child_env(retry, run_dir)},
            forward_termination=True,
            termination_timeout_seconds=self.termination_timeout_s,
        )
        try:
            return client.run(
                context=context, command=command, extras={"run_dir": str(run_dir), **(extras or {})}
            )
        except DagsterPipesExecutionError as e:
            raise self._failure(context, module, log_dir, e) from None

    @staticmethod
    def _reap_leftovers(context: dg.AssetExecutionContext | dg.OpExecutionContext, run_dir: Path) -> None:
        try:
            killed = reap_and_claim(lifeline_dir(run_dir.resolve()))
        except RunFolderBusy as e:
            raise dg.Failure(str(e)) from None
        if killed:
            listed = ", ".join(f"{r.role} pid {r.pid}" for r in killed)
            context.log.warning(
                f"killed {len(killed)} leftover processes of an earlier launch in {run_dir}: {listed}"
            )

    def _failure(self, context, module: str, log_dir: Path, cause: Exception) -> dg.Failure:
        errors = read_rank_errors(log_dir)
        if not errors:
            context.log.error(f"{module}: torchrun failed without a rank error file ({cause})")
            return dg.Failure(f"{module}: torchrun failed ({cause}); see the compute logs and {log_dir}")
        for err in errors:
            context.log.error(f"{module}: local rank {err.local_rank} failed: {err.message}\n{err.traceback}")
        root = errors[0]
        return dg.Failure(
            description=f"{module}: local rank {root.local_rank} failed: {root.message}",
            metadata={
                "failed_local_ranks": dg.MetadataValue.json([e.local_rank for e in errors]),
                "root_cause_traceback": dg.MetadataValue.md(f"```\n{root.traceback}\n```"),
                "torchrun_log_dir": dg.MetadataValue.path(str(log_dir)),
            },
        )
