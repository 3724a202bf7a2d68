"""What DeepSpeed does silently on CPU is said in the run log, and its accelerator warning is not
printed by every rank."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gc25d_core.train.zero2 import CPU_COMM_OP, cpu_op_build_note

ROOT = Path(__file__).resolve().parents[2]


def test_the_first_cpu_op_build_is_announced_and_a_cached_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    note = cpu_op_build_note()
    assert note is not None and CPU_COMM_OP in note and str(tmp_path) in note
    (tmp_path / "py311_cpu" / CPU_COMM_OP).mkdir(parents=True)
    (tmp_path / "py311_cpu" / CPU_COMM_OP / f"{CPU_COMM_OP}.so").write_bytes(b"")
    assert cpu_op_build_note() is None


@pytest.mark.parametrize(
    "first",
    [
        "from gc25d_core.compat import name_the_deepspeed_accelerator as n; n()",  # a job's start
        "import gc25d_core.models.vae",  # DiffSynth's checkpointing imports DeepSpeed (a preview)
    ],
    ids=["job", "diffsynth"],
)
def test_a_process_without_cuda_names_the_cpu_accelerator_so_deepspeed_does_not_warn(first):
    code = f"import os\n{first}\nimport deepspeed\nprint(os.environ['DS_ACCELERATOR'])\n"
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cpu"
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr


def test_setup_builds_the_cpu_op_where_the_jobs_load_it():
    """`make setup` calls build_cpu_comm_op into the checkout's extensions folder, the one the jobs
    use: afterwards a job has nothing to announce (a cached build is loaded, not compiled again)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    code = (
        "from gc25d_core.train.zero2 import build_cpu_comm_op, cpu_op_build_note\n"
        "print(build_cpu_comm_op()); print(cpu_op_build_note())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    built, note = proc.stdout.strip().splitlines()[-2:]
    assert built.endswith(f"/{CPU_COMM_OP}/{CPU_COMM_OP}.so")
    assert built.startswith(env["TORCH_EXTENSIONS_DIR"])
    assert note == "None"
