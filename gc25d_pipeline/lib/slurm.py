"""SlurmLauncher: runs a job's torchrun on a Slurm cluster with ``sbatch``, reporting through Pipes.

The Dagster step runs where the Slurm commands work (a login node, or a node of the cluster) and on
a filesystem the compute nodes share: the run folder holds the job script, the Pipes files
(lib/launcher.py), torchrun's per-rank error files and Slurm's output. One launch:

1. An earlier job recorded in ``<run_dir>/.slurm_job`` that is still queued or running is cancelled
   first (a retry never runs beside the job of the attempt it replaces).
2. ``sbatch`` a script asking ``nnodes`` nodes with one task each; ``srun`` starts on every node the
   same ``python -m gc25d_core.lifeline`` command as TorchrunLauncher, joined by a c10d rendezvous
   on the allocation's first node (port 20000 + job id mod 20000, so jobs sharing a node do not
   collide) and ``--kill-on-bad-exit`` so a failed node ends the others.
3. Follow the job with ``scontrol show job`` (``sacct`` once the controller has forgotten it)
   until it ends; Pipes messages stream from the shared file meanwhile.
4. COMPLETED with exit 0 is success. FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
   OUT_OF_MEMORY, BOOT_FAIL and DEADLINE fail the step with the state, the failing rank's error
   (torchrun's error files) and the tail of Slurm's output in the run log. Retries are allowed: the
   stage resumes from the state in its run folder.
5. When the Dagster run is terminated, the job is ``scancel``ed and the step ends interrupted.

Why not dagster-slurm (docs/decisions.md): it reaches the cluster over SSH and ships the environment
with pixi-pack, while this project's jobs run from a shared checkout and virtualenv and report over
the shared filesystem; it would add an SSH server, pixi (a downloaded binary) and its own Pipes
transport to every test, for ~150 lines of sbatch / scontrol / scancel here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError
from pydantic import Field, ValidationInfo, field_validator

from gc25d_core.atomic import atomic_write_text
from gc25d_pipeline.lib.launcher import (
    Context,
    JobLauncher,
    PreparedLaunch,
    rank_failure,
    shared_fs_pipes,
    shell_join,
)

JOB_RECORD = ".slurm_job"
ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED",
     "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
)  # fmt: skip
FAILED_STATES = {
    "FAILED": "failed",
    "CANCELLED": "was cancelled outside Dagster (scancel, an administrator or the scheduler)",
    "TIMEOUT": "hit its time limit",
    "NODE_FAIL": "lost a node",
    "PREEMPTED": "was preempted",
    "OUT_OF_MEMORY": "ran out of memory",
    "BOOT_FAIL": "could not boot its nodes",
    "DEADLINE": "missed its deadline",
}
_NODE, _HEAD, _PORT, _JOB = "@SLURM_NODEID@", "@RDZV_HOST@", "@RDZV_PORT@", "@SLURM_JOB_ID@"
_KV = re.compile(r"(\w+)=(\S*)")
# The grammars of the fields that become sbatch options. Each value is also quoted where it enters
# the job script, but sbatch reads an #SBATCH line only up to its newline (quotes or not), so a value
# must never hold one: it would end the comment and run the rest as a command.
_NAME = r"[A-Za-z0-9_.-]+"
PARTITION = re.compile(rf"{_NAME}(?:,{_NAME})*")  # one partition or a comma-separated list
ACCOUNT = re.compile(_NAME)
# sbatch --time: min, min:sec, h:min:sec, d-h, d-h:min, d-h:min:sec, or no limit
TIME_LIMIT = re.compile(r"\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}|(?i:unlimited|infinite)")
MEM = re.compile(r"\d+[KMGTkmgt]?")
SBATCH_ARG = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(?:=[^\n\r\0]*)?")


class SlurmError(RuntimeError):
    """A Slurm command failed (controller unreachable, bad request)."""


@dataclass(frozen=True)
class SlurmJob:
    """What ``scontrol``/``sacct`` said about a job."""

    job_id: str
    state: str  # base state: "CANCELLED by 0" -> CANCELLED
    exit_code: str = ""
    reason: str = ""
    time_limit: str = ""
    run_time: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` output (one line of Key=Value pairs) as a dict."""
    return dict(_KV.findall(text))


class SlurmLauncher(JobLauncher):
    """Submits the job with sbatch (one task per node, torchrun inside) and follows it to its end."""

    partition: str | None = Field(
        default=None, description="sbatch --partition: a name or a comma-separated list ([A-Za-z0-9_.-])"
    )
    account: str | None = Field(default=None, description="sbatch --account ([A-Za-z0-9_.-])")
    time_limit: str | None = Field(
        default=None, description="sbatch --time in Slurm's formats, e.g. 7-00:00:00, 90, UNLIMITED"
    )
    gpus_per_node: int = Field(default=0, ge=0, description="sbatch --gpus-per-node (0: none asked)")
    cpus_per_task: int | None = Field(
        default=None, ge=1, description="sbatch --cpus-per-task (the node's task)"
    )
    mem: str | None = Field(default=None, description="sbatch --mem per node: digits[K|M|G|T], 0 for all")
    sbatch_args: list[str] = Field(
        default_factory=list,
        description="more sbatch options, one --option[=value] per item, unquoted (the launcher quotes)",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run on every node before torchrun (module load, source a venv). "
        "Shell by design: they run verbatim in node.sh, with the launching user's rights, like any "
        "line of the job script; the one field here that is not validated or quoted",
    )
    rdzv_port: int = Field(
        default=0, ge=0, le=65535, description="rendezvous port; 0: 20000 + job id mod 20000"
    )
    poll_interval_s: float = Field(default=5.0, gt=0, description="seconds between scontrol polls")
    cancel_timeout_s: float = Field(
        default=60.0, ge=0, description="how long to wait for a cancelled job to end"
    )
    slurm_bin: str = Field(
        default="", description="absolute folder of sbatch/scontrol/sacct/scancel; empty: PATH"
    )

    @field_validator("partition", "account", "time_limit", "mem")
    @classmethod
    def _sbatch_value(cls, value: str | None, info: ValidationInfo) -> str | None:
        grammar = {"partition": PARTITION, "account": ACCOUNT, "time_limit": TIME_LIMIT, "mem": MEM}
        pattern = grammar[str(info.field_name)]
        if value is not None and not pattern.fullmatch(value):
            raise ValueError(f"{value!r} does not match {pattern.pattern}")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, args: list[str]) -> list[str]:
        for arg in args:
            if not SBATCH_ARG.fullmatch(arg):
                raise ValueError(
                    f"{arg!r} is not one --option[=value] token without a newline ({SBATCH_ARG.pattern})"
                )
        return args

    @field_validator("slurm_bin")
    @classmethod
    def _slurm_bin(cls, folder: str) -> str:
        path = PurePosixPath(folder)
        if folder and (not path.is_absolute() or ".." in path.parts or "\0" in folder):
            raise ValueError(f"{folder!r} must be an absolute folder without '..' (or empty: PATH)")
        return folder

    # --- Slurm commands --------------------------------------------------------------------------

    def _cmd(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        exe = str(Path(self.slurm_bin) / name) if self.slurm_bin else name
        try:
            return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{name} {' '.join(args)}: {e}") from None

    def submit(self, script: Path) -> str:
        proc = self._cmd("sbatch", "--parsable", str(script))
        if proc.returncode != 0:
            raise SlurmError(f"sbatch {script} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]  # "<id>[;<cluster>]"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch {script}: unexpected output {proc.stdout!r}")
        return job_id

    def job(self, job_id: str) -> SlurmJob:
        proc = self._cmd("scontrol", "show", "job", "-o", job_id)
        if proc.returncode == 0 and (kv := parse_scontrol(proc.stdout)).get("JobState"):
            return SlurmJob(
                job_id=job_id,
                state=kv["JobState"],
                exit_code=kv.get("ExitCode", ""),
                reason=kv.get("Reason", ""),
                time_limit=kv.get("TimeLimit", ""),
                run_time=kv.get("RunTime", ""),
            )
        # the controller forgets finished jobs after MinJobAge; accounting may still know
        acct = self._cmd("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,Timelimit,Elapsed")
        line = acct.stdout.strip().splitlines()[0] if acct.returncode == 0 and acct.stdout.strip() else ""
        if line:
            state, exit_code, limit, elapsed = (line.split("|") + ["", "", "", ""])[:4]
            return SlurmJob(
                job_id=job_id,
                state=state.split()[0],
                exit_code=exit_code,
                time_limit=limit,
                run_time=elapsed,
            )
        raise SlurmError(
            f"Slurm knows no job {job_id}: scontrol said {proc.stderr.strip() or proc.stdout.strip()!r}, "
            f"sacct {acct.stderr.strip() or 'nothing'!r}"
        )

    def cancel(self, job_id: str) -> SlurmJob | None:
        """scancel and wait (bounded) until the job has ended; its last known state."""
        self._cmd("scancel", job_id)
        deadline = time.monotonic() + self.cancel_timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.job(job_id)
            except SlurmError:
                return last
            if not last.active:
                return last
            time.sleep(min(self.poll_interval_s, 1.0))
        return last

    # --- the job script --------------------------------------------------------------------------

    def script(self, module: str, launch: PreparedLaunch, env: dict[str, str], name: str) -> str:
        opts = [
            f"--job-name={name}",
            f"--nodes={self.nnodes}",
            "--ntasks-per-node=1",
            f"--output={launch.log_dir}/slurm-%j.out",
            "--open-mode=append",
        ]
        opts += [f"--partition={self.partition}"] if self.partition else []
        opts += [f"--account={self.account}"] if self.account else []
        opts += [f"--time={self.time_limit}"] if self.time_limit else []
        opts += [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
        opts += [f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        opts += [f"--mem={self.mem}"] if self.mem is not None else []
        opts += self.sbatch_args
        torchrun = self.torchrun_args(
            module,
            launch.job_args,
            launch.log_dir,
            node_rank=_NODE,
            rdzv_endpoint=f"{_HEAD}:{_PORT}",
            rdzv_id=_JOB,
        )
        command = shell_join(
            [self.python, *torchrun],
            {_NODE: "SLURM_NODEID", _HEAD: "GC25D_RDZV_HOST", _PORT: "GC25D_RDZV_PORT", _JOB: "SLURM_JOB_ID"},
        )
        port = str(self.rdzv_port) if self.rdzv_port else "$((20000 + SLURM_JOB_ID % 20000))"
        node_script = launch.log_dir / "node.sh"
        node_lines = ["#!/usr/bin/env bash", "set -euo pipefail", *self.setup, f"exec {command}", ""]
        atomic_write_text(node_script, "\n".join(node_lines))
        lines = [
            "#!/usr/bin/env bash",
            f"# {module}: written by SlurmLauncher; srun runs node.sh once per node.",
            *(f"#SBATCH {shlex.quote(o)}" for o in opts),
            "set -euo pipefail",
            *(f"export {k}={shell_join([v])}" for k, v in env.items()),
            'export GC25D_RDZV_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            f"export GC25D_RDZV_PORT={port}",
            f"cd {shell_join([str(Path.cwd())])}",
            'srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes="$SLURM_JOB_NUM_NODES" '
            f"bash {shell_join([str(node_script)])}",
            "",
        ]
        return "\n".join(lines)

    # --- the launch ------------------------------------------------------------------------------

    def _cancel_leftover(self, context: Context, run_dir: Path) -> None:
        record = run_dir / JOB_RECORD
        if not record.is_file():
            return
        try:
            job_id = str(json.loads(record.read_text())["job_id"])
            job = self.job(job_id)
        except (OSError, ValueError, KeyError, SlurmError):
            return  # unreadable or forgotten: nothing of it can still be running
        if job.active:
            context.log.warning(
                f"cancelling Slurm job {job_id} ({job.state}) of an earlier launch in {run_dir}"
            )
            self.cancel(job_id)

    def before_launch(self, context: Context, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self._cancel_leftover(context, run_dir)

    def run_job(
        self, context: Context, module: str, launch: PreparedLaunch, extras: dict[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        launch.log_dir.mkdir(parents=True, exist_ok=True)
        run_dir, retry = launch.run_dir, context.retry_number
        name = f"gc25d-{run_dir.parent.name}-{run_dir.name}"[:100]
        with dg.open_pipes_session(context=context, extras=extras, **shared_fs_pipes(launch)) as session:
            env = {**self.job_env(retry), **session.get_bootstrap_env_vars()}
            script = launch.log_dir / "job.sbatch"
            atomic_write_text(script, self.script(module, launch, env, name))
            try:
                job_id = self.submit(script)
            except SlurmError as e:
                raise dg.Failure(f"{module}: {e}") from None
            atomic_write_text(run_dir / JOB_RECORD, json.dumps({"job_id": job_id, "attempt": retry}))
            context.log.info(
                f"submitted Slurm job {job_id}: {self.nnodes} node(s) x {self.nproc_per_node} ranks ({script})"
            )
            try:
                job = self._follow(job_id)
            except (DagsterExecutionInterruptedError, KeyboardInterrupt):
                context.log.warning(f"run terminated: cancelling Slurm job {job_id}")
                end = self.cancel(job_id)
                context.log.info(f"Slurm job {job_id} ended {end.state if end else 'unknown'}")
                raise
            except SlurmError as e:
                raise dg.Failure(f"{module}: following Slurm job {job_id}: {e}") from None
        metadata = {"slurm_job_id": dg.MetadataValue.text(job_id)}
        if job.state == "COMPLETED" and job.exit_code in ("", "0:0"):
            return dg.PipesClientCompletedInvocation(session, metadata=metadata)
        raise self._job_failure(context, module, launch, job, metadata)

    def _follow(self, job_id: str) -> SlurmJob:
        while True:
            job = self.job(job_id)
            if not job.active:
                return job
            time.sleep(self.poll_interval_s)

    def _job_failure(
        self, context: Context, module: str, launch: PreparedLaunch, job: SlurmJob, metadata: dict[str, Any]
    ) -> dg.Failure:
        what = FAILED_STATES.get(job.state, f"ended in state {job.state}")
        headline = f"Slurm job {job.job_id} {what} ({job.state}, exit code {job.exit_code or '?'}"
        headline += f", ran {job.run_time}" if job.run_time else ""
        headline += f", limit {job.time_limit})" if job.state == "TIMEOUT" and job.time_limit else ")"
        out = launch.log_dir / f"slurm-{job.job_id}.out"
        if out.is_file():
            tail = "\n".join(out.read_text(errors="replace").splitlines()[-40:])
            context.log.error(f"{module}: last lines of {out}:\n{tail}")
        metadata = {**metadata, "slurm_state": dg.MetadataValue.text(job.state)}
        if out.is_file():
            metadata["slurm_output"] = dg.MetadataValue.path(str(out))
        return rank_failure(context, module, launch.log_dir, headline, metadata)
