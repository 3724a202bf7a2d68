"""KubernetesLauncher: runs a job's torchrun as an Indexed Job with a headless Service, through Pipes.

One pod per node (``completions = parallelism = nnodes``, ``completionMode: Indexed``); each pod
runs the same ``python -m gc25d_core.lifeline`` command as TorchrunLauncher with
``--node-rank=$JOB_COMPLETION_INDEX``, and the c10d rendezvous is pod 0 through the headless
Service: ``<job>-0.<job>:<port>`` (the pods' ``subdomain`` is the Service, which publishes addresses
before readiness so that the rendezvous resolves while the pods start). ``backoffLimit: 0``: a failed
pod fails the Job and Dagster's retry policy relaunches it, resuming from the run folder (retrying
one pod inside the Job would leave the step waiting on a half-alive rendezvous).

The Dagster step and the pods share one ReadWriteMany volume (``shared_claim`` mounted at
``shared_mount``): the run folder, the Pipes files (lib/launcher.py) and torchrun's error files lie
on it, so the run folder must be under ``shared_mount``. GPUs are ``nvidia.com/gpu`` limits; ``/dev/shm``
is a memory ``emptyDir`` (the container default of 64 MiB is too small for NCCL and data loaders).

``render`` is pure (tests compare it with golden manifests, tests/golden/k8s/); ``launch`` submits
through the official ``kubernetes`` client (imported only then), follows the Job, deletes it when
the Dagster run is terminated, and deletes the Service when the Job has ended.

Why not dagster-k8s' PipesK8sClient: it runs one pod per call, and multi-node torchrun needs several
pods that find each other; dagster-k8s 0.29.27 also pins dagster 1.13.27 and kubernetes < 37.
"""

from __future__ import annotations

import re
import time
from pathlib import Path, PurePosixPath
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError
from pydantic import Field, ValidationInfo, field_validator

from gc25d_pipeline.lib.launcher import (
    Context,
    JobLauncher,
    PreparedLaunch,
    rank_failure,
    shared_fs_pipes,
    shell_join,
)

_NODE = "@JOB_COMPLETION_INDEX@"
_DNS = re.compile(r"[^a-z0-9-]+")


def k8s_name(*parts: str, limit: int = 52) -> str:
    """A DNS-1123 label from ``parts`` (lowercase, '-', at most ``limit`` characters so that the pod
    hostnames ``<name>-<index>`` stay under 63)."""
    name = _DNS.sub("-", "-".join(parts).lower()).strip("-")
    return name[:limit].rstrip("-") or "gc25d"


class KubernetesLauncher(JobLauncher):
    """Renders and submits an Indexed Job + headless Service; the step follows it to its end."""

    namespace: str = "default"
    image: str = Field(default="", description="container image with this checkout's environment")
    image_pull_policy: str = "IfNotPresent"
    workdir: str = Field(
        default="", description="the checkout inside the image, absolute (PYTHONPATH); empty: cwd"
    )
    shared_claim: str = Field(default="", description="ReadWriteMany PVC holding the runs root")
    shared_mount: str = Field(
        default="/shared", description="where the PVC is mounted, absolute (same path as here)"
    )
    gpus_per_node: int = Field(default=0, ge=0, description="nvidia.com/gpu per pod")
    cpu: str | None = Field(default=None, description="CPU request and limit per pod, e.g. '96'")
    memory: str | None = Field(default=None, description="memory request and limit per pod, e.g. '1500Gi'")
    shm_size: str = Field(default="64Gi", description="size of the /dev/shm emptyDir")
    rdzv_port: int = Field(default=29500, ge=1, le=65535)
    service_account: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    active_deadline_s: int | None = Field(default=None, ge=1, description="Job activeDeadlineSeconds")
    poll_interval_s: float = Field(default=10.0, gt=0)

    @field_validator("workdir", "shared_mount")
    @classmethod
    def _absolute(cls, folder: str, info: ValidationInfo) -> str:
        # paths inside the pod: refused at load, not at submission hours later (or resolved against
        # whatever WORKDIR the image happens to have)
        path = PurePosixPath(folder)
        if (folder or info.field_name == "shared_mount") and (not path.is_absolute() or ".." in path.parts):
            raise ValueError(f"{folder!r} must be an absolute path without '..'")
        return folder

    def render(
        self, module: str, launch: PreparedLaunch, env: dict[str, str], name: str
    ) -> list[dict[str, Any]]:
        """The headless Service and the Indexed Job of one launch, as plain manifests."""
        labels = {"app.kubernetes.io/name": "gc25d", "gc25d/job": name}
        torchrun = self.torchrun_args(
            module,
            launch.job_args,
            launch.log_dir,
            node_rank=_NODE,
            rdzv_endpoint=f"{name}-0.{name}:{self.rdzv_port}",
            rdzv_id=name,
        )
        command = shell_join([self.python, *torchrun], {_NODE: "JOB_COMPLETION_INDEX"})
        workdir = self.workdir or str(Path.cwd())
        container_env = {**env, "PYTHONPATH": workdir}
        resources: dict[str, dict[str, str]] = {}
        limits = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
        if self.gpus_per_node:
            limits["nvidia.com/gpu"] = str(self.gpus_per_node)
        if limits:
            resources = {"limits": limits, "requests": dict(limits)}
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
        volumes: list[dict[str, Any]] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": self.shm_size}}
        ]
        if self.shared_claim:
            mounts.append({"name": "shared", "mountPath": self.shared_mount})
            volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": self.shared_claim}})
        container: dict[str, Any] = {
            "name": "torchrun",
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            "workingDir": workdir,
            "command": ["bash", "-c", f"exec {command}"],
            "env": [{"name": k, "value": v} for k, v in sorted(container_env.items())],
            "ports": [{"name": "rdzv", "containerPort": self.rdzv_port}],
            "volumeMounts": mounts,
        }
        if resources:
            container["resources"] = resources
        pod_spec: dict[str, Any] = {
            "subdomain": name,  # with the headless Service: <name>-<index>.<name> resolves
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": volumes,
        }
        if self.service_account:
            pod_spec["serviceAccountName"] = self.service_account
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = list(self.tolerations)
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": self.nnodes,
            "parallelism": self.nnodes,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        }
        if self.active_deadline_s:
            job_spec["activeDeadlineSeconds"] = self.active_deadline_s
        meta = {"name": name, "namespace": self.namespace, "labels": dict(labels)}
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"gc25d/job": name},
                "ports": [{"name": "rdzv", "port": self.rdzv_port}],
            },
        }
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {**meta, "labels": dict(labels)},
            "spec": job_spec,
        }
        return [service, job]

    def check_shared(self, run_dir: Path) -> None:
        if not self.shared_claim:
            raise dg.Failure(
                "KubernetesLauncher.shared_claim is empty: the pods need the run folder's volume"
            )
        if not run_dir.resolve().is_relative_to(Path(self.shared_mount)):
            raise dg.Failure(
                f"run folder {run_dir} is not under KubernetesLauncher.shared_mount={self.shared_mount}: "
                "set paths.runs_root on the shared volume"
            )

    def before_launch(self, context: Context, run_dir: Path) -> None:
        from kubernetes import config  # only a Kubernetes launch needs the client

        self.check_shared(run_dir)
        if not self.image:
            raise dg.Failure("KubernetesLauncher.image is empty")
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()

    def run_job(
        self, context: Context, module: str, launch: PreparedLaunch, extras: dict[str, Any]
    ) -> dg.PipesClientCompletedInvocation:
        from kubernetes import client  # configured by before_launch

        core, batch = client.CoreV1Api(), client.BatchV1Api()
        launch.log_dir.mkdir(parents=True, exist_ok=True)
        name = k8s_name(
            "gc25d", launch.run_dir.parent.name, context.run.run_id[:8], str(context.retry_number)
        )
        with dg.open_pipes_session(context=context, extras=extras, **shared_fs_pipes(launch)) as session:
            env = {**self.job_env(context.retry_number), **session.get_bootstrap_env_vars()}
            service, job = self.render(module, launch, env, name)
            core.create_namespaced_service(self.namespace, service)
            batch.create_namespaced_job(self.namespace, job)
            context.log.info(f"created Job {self.namespace}/{name}: {self.nnodes} pod(s)")
            try:
                ok, why = self._follow(batch, name)
            except (DagsterExecutionInterruptedError, KeyboardInterrupt):
                context.log.warning(f"run terminated: deleting Job {self.namespace}/{name}")
                self._delete(core, batch, name, job_too=True)
                raise
            self._delete(core, batch, name, job_too=False)
        if ok:
            return dg.PipesClientCompletedInvocation(
                session, metadata={"k8s_job": f"{self.namespace}/{name}"}
            )
        raise rank_failure(context, module, launch.log_dir, f"Kubernetes Job {self.namespace}/{name} {why}")

    def _follow(self, batch: Any, name: str) -> tuple[bool, str]:
        while True:
            status = batch.read_namespaced_job_status(name, self.namespace).status
            for cond in status.conditions or []:
                if cond.status == "True" and cond.type == "Complete":
                    return True, "completed"
                if cond.status == "True" and cond.type == "Failed":
                    return False, f"failed: {cond.reason}: {cond.message}"
            time.sleep(self.poll_interval_s)

    def _delete(self, core: Any, batch: Any, name: str, job_too: bool) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            core.delete_namespaced_service(name, self.namespace)
            if job_too:
                batch.delete_namespaced_job(name, self.namespace, propagation_policy="Foreground")
        except ApiException as e:
            if e.status != 404:
                raise
