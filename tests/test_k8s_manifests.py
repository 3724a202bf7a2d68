"""KubernetesLauncher's rendered manifests against golden files (no cluster here), and a round trip
through the official client's models, which drops any field the API does not know."""

import json
import os
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient

from gc25d_pipeline.lib.k8s import KubernetesLauncher, k8s_name
from gc25d_pipeline.lib.launcher import PreparedLaunch

GOLDEN = Path(__file__).parent / "golden" / "k8s"
RUN = Path("/shared/gc25d/outputs/v10/sft/v000001")
# fixed stand-ins for the per-run values (Pipes bootstrap, retry) so the manifests are stable
ENV = {
    "DAGSTER_PIPES_CONTEXT": "<bootstrap: context file on the shared volume>",
    "DAGSTER_PIPES_MESSAGES": "<bootstrap: messages file on the shared volume>",
    "GC25D_RETRY_NUMBER": "0",
    "NCCL_NVLS_ENABLE": "0",
    "PYTHONUNBUFFERED": "1",
}
# what both cases' image and volume look like
IMAGE = {
    "python": "/opt/gc25d/.venv/bin/python",
    "image": "registry.example/gc25d:1.0",
    "workdir": "/opt/gc25d",
    "shared_claim": "gc25d-shared",
}
CASES = {
    "sft_2x8_h200": KubernetesLauncher(
        **IMAGE,
        nnodes=2,
        nproc_per_node=8,
        namespace="research",
        shared_mount="/shared",
        gpus_per_node=8,
        cpu="96",
        memory="1500Gi",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    ),
    "cluster_check_1x2_cpu": KubernetesLauncher(**IMAGE, nnodes=1, nproc_per_node=2),
}
MODULES = {"sft_2x8_h200": "gc25d_core.jobs.sft", "cluster_check_1x2_cpu": "gc25d_core.jobs.cluster_check"}


def _render(case: str) -> list[dict]:
    launch = PreparedLaunch(
        run_dir=RUN,
        config_path=RUN / "config.yaml",
        log_dir=RUN / "torchrun_logs" / "attempt-00",
        pipes_dir=RUN / "pipes" / "attempt-00",
        job_args=["--config", str(RUN / "config.yaml"), "--run-dir", str(RUN)],
    )
    name = k8s_name("gc25d", "sft", "0123abcd", "0")
    return CASES[case].render(MODULES[case], launch, ENV, name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_match_golden(case):
    rendered = yaml.safe_dump_all(_render(case), sort_keys=True)
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("GC25D_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.is_file(), f"{golden} missing: run with GC25D_UPDATE_GOLDEN=1 and review the diff"
    assert rendered == golden.read_text(), f"{golden} differs (GC25D_UPDATE_GOLDEN=1 rewrites it)"


class _Response:  # what ApiClient.deserialize reads
    def __init__(self, obj):
        self.data = json.dumps(obj)


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_round_trip_through_the_client_models(case):
    api = ApiClient()
    for manifest, model in zip(_render(case), ("V1Service", "V1Job"), strict=True):
        back = api.sanitize_for_serialization(api.deserialize(_Response(manifest), model))
        assert back == manifest, f"{model}: fields the API does not know or got wrong"


def test_rendezvous_and_node_rank_wiring():
    service, job = _render("sft_2x8_h200")
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"] == name
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    command = pod["containers"][0]["command"][2]
    assert f"--rdzv-endpoint={name}-0.{name}:29500" in command
    assert '--node-rank="${JOB_COMPLETION_INDEX}"' in command
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert len(name) + len("-1") <= 63


def test_run_folder_must_be_on_the_shared_volume(tmp_path):
    import dagster as dg

    with pytest.raises(dg.Failure, match="not under KubernetesLauncher.shared_mount"):
        CASES["sft_2x8_h200"].check_shared(tmp_path)
