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

Several nodes (``nnodes > 1``): this step runs the agent of node 0, which hosts the c10d rendezvous
store at ``rdzv_endpoint`` (an address of this machine). The other nodes' agents are started by
whoever owns those machines (a scheduler, ssh, a test) with the script this launcher writes before
it starts its own: ``bash <run_dir>/torchrun_logs/attempt-NN/peer_node.sh <node_rank>``. Pipes then
goes through files in the run folder (lib/launcher.py), so the run folder must be on a filesystem
every node shares. Stopping node 0 stops the job everywhere: its ranks die, the peers' ranks lose
their collectives and fail, and each peer agent exits (``max_restarts`` 0).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterPipesExecutionError
from pydantic import Field, field_validator

from gc25d_core.atomic import atomic_write_text
from gc25d_core.lifeline import DIR_ENV, PARENT_ENV, RunFolderBusy, lifeline_dir, reap_and_claim
from gc25d_pipeline.lib.launcher import (
    Context,
    JobLauncher,
    PreparedLaunch,
    RankError,
    rank_failure,
    read_rank_errors,
    shared_fs_bootstrap_env,
    shared_fs_pipes,
    shell_join,
)

__all__ = ["RankError", "TorchrunLauncher", "read_rank_errors"]

PEER_SCRIPT = "peer_node.sh"
_NODE = "@NODE_RANK@"  # placeholder for the node rank a peer script is run with
_ENDPOINT = re.compile(r"(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?")


class TorchrunLauncher(JobLauncher):
    """Runs the job's torchrun as a child of this step (node 0); more nodes join by rendezvous."""

    node_rank: int = Field(default=0, description="must be 0 here: this step runs node 0's agent")
    rdzv_endpoint: str | None = Field(
        default=None, description="host:port of this machine for multi-node; None = --standalone"
    )
    rdzv_backend: str = Field(default="c10d", description="only c10d (the rendezvous the peers join)")
    termination_timeout_s: float = Field(
        default=20.0, gt=0, description="seconds between forwarding SIGINT to torchrun and killing it"
    )

    @field_validator("rdzv_endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        match = _ENDPOINT.fullmatch(endpoint) if endpoint is not None else None
        if endpoint is not None and (
            match is None or (match["port"] is not None and not 1 <= int(match["port"]) <= 65535)
        ):
            raise ValueError(f"{endpoint!r} is not host[:port] with a port in 1..65535")
        return endpoint

    def command(self, module: str, args: list[str], log_dir: Path, rdzv_id: str = "none") -> list[str]:
        """The node-0 torchrun command (``--log-dir`` is ``log_dir/node-0``)."""
        if self.rdzv_backend != "c10d":
            raise dg.Failure(f"TorchrunLauncher.rdzv_backend={self.rdzv_backend!r}: only 'c10d' is supported")
        # node 0 hosts the store: explicit, because on one machine (tests) every agent's address
        # matches the endpoint and the first to start would host it
        conf = "is_host=1" if self.nnodes > 1 or self.rdzv_endpoint else None
        return [
            self.python,
            *self.torchrun_args(
                module,
                args,
                log_dir,
                node_rank="0",
                rdzv_endpoint=self.rdzv_endpoint,
                rdzv_id=rdzv_id,
                rdzv_conf=conf,
            ),
        ]

    def peer_script(self, module: str, launch: PreparedLaunch, rdzv_id: str, retry: int) -> str:
        """``bash peer_node.sh NODE_RANK``: the same job on another node, a client of node 0's store."""
        env = {**self.job_env(retry), **shared_fs_bootstrap_env(launch)}
        torchrun = self.torchrun_args(
            module,
            launch.job_args,
            launch.log_dir,
            node_rank=_NODE,
            rdzv_endpoint=self.rdzv_endpoint,
            rdzv_id=rdzv_id,
            rdzv_conf="is_host=0",
        )
        command = shell_join([self.python, *torchrun], {_NODE: "NODE_RANK"})
        exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
        return (
            "#!/usr/bin/env bash\n"
            f"# Node NODE_RANK (1..{self.nnodes - 1}) of {module}, attempt {retry}: written by TorchrunLauncher.\n"
            "set -euo pipefail\n"
            'NODE_RANK="${1:?usage: peer_node.sh NODE_RANK}"\n'
            f"{exports}\n"
            f"exec {command}\n"
        )

    def child_env(self, retry_number: int, run_dir: Path) -> dict[str, str]:
        return {
            **self.job_env(retry_number),
            PARENT_ENV: str(os.getpid()),  # Pipes' Popen runs in this process: torchrun dies with it
            DIR_ENV: str(lifeline_dir(run_dir.resolve())),
        }

    def before_launch(self, context: Context, run_dir: Path) -> None:
        if self.node_rank != 0:
            raise dg.Failure("TorchrunLauncher must run on node_rank 0 (the other nodes run peer_node.sh)")
        run_dir.mkdir(parents=True, exist_ok=True)
        self._reap_leftovers(context, run_dir)

    def run_job(
        self, context: Context, module: str, launch: PreparedLaunch, extras: dict[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        """torchrun as a child of this step (node 0), after the peers' script; fail with the rank's error."""
        retry = context.retry_number
        multi = self.nnodes > 1
        # one rendezvous per attempt: a peer of the last attempt can never join this one
        rdzv_id = f"{context.run.run_id[:8]}-{retry}" if multi else "none"
        command = self.command(module, launch.job_args, launch.log_dir, rdzv_id)
        context.log.info(f"launching {self.nnodes}x{self.nproc_per_node} ranks: {' '.join(command)}")
        pipes: dict[str, Any] = {}
        if multi:
            script = launch.log_dir / PEER_SCRIPT
            launch.log_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(script, self.peer_script(module, launch, rdzv_id, retry))
            context.log.info(
                f"node 0 hosts the rendezvous at {self.rdzv_endpoint}; on each other node run: "
                f"bash {script} NODE_RANK"
            )
            pipes = shared_fs_pipes(launch)
        client = dg.PipesSubprocessClient(
            env={**os.environ, **self.child_env(retry, launch.run_dir)},
            forward_termination=True,
            termination_timeout_seconds=self.termination_timeout_s,
            **pipes,
        )
        try:
            return client.run(context=context, command=command, extras=extras)
        except DagsterPipesExecutionError as e:
            raise rank_failure(context, module, launch.log_dir, f"torchrun failed ({e})") from None

    @staticmethod
    def _reap_leftovers(context: Context, run_dir: Path) -> None:
        try:
            killed = reap_and_claim(lifeline_dir(run_dir.resolve()))
        except RunFolderBusy as e:
            raise dg.Failure(str(e)) from None
        if killed:
            listed = ", ".join(f"{r.role} pid {r.pid}" for r in killed)
            context.log.warning(
                f"killed {len(killed)} leftover processes of an earlier launch in {run_dir}: {listed}"
            )
