"""gc25d_core.numerics: the record a run keeps (done.json, tiny_vae.json, eval rows) with the CPU
read from /proc/cpuinfo's format, the kernels' pins as the process has them, the line the teacher's
and the eval's tables print; and the settling of MKL's vector-maths dispatch before a process
computes on several threads."""

from __future__ import annotations

import os

from gc25d_core.numerics import (
    NUMERICS_PINS,
    cpu_identity,
    numerics_differ,
    numerics_line,
    numerics_record,
)

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
"""


def test_the_cpu_is_read_from_cpuinfo_and_unknown_where_it_cannot_be(tmp_path):
    (tmp_path / "cpuinfo").write_text(INTEL)
    assert cpu_identity(tmp_path / "cpuinfo") == ("GenuineIntel", "Intel(R) Xeon(R) Processor")
    (tmp_path / "amd").write_text("vendor_id : AuthenticAMD\nmodel name : AMD EPYC 7B13\n")
    assert cpu_identity(tmp_path / "amd") == ("AuthenticAMD", "AMD EPYC 7B13")
    assert cpu_identity(tmp_path / "absent") == ("unknown", "unknown")
    (tmp_path / "bare").write_text("processor : 0\n")
    assert cpu_identity(tmp_path / "bare") == ("unknown", "unknown")


def test_the_record_holds_the_pins_as_set_and_none_where_unset(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    record = numerics_record("cpu")
    assert set(record["pins"]) == set(NUMERICS_PINS)
    assert record["pins"]["MKL_CBWR"] == "COMPATIBLE" and record["pins"]["OPENBLAS_CORETYPE"] is None
    assert "accelerator" not in record
    line = numerics_line(record)
    assert line.startswith("numerics: ") and "MKL_CBWR=COMPATIBLE" in line
    assert "OPENBLAS_CORETYPE" not in line  # unset: not named as if pinned


def test_the_line_names_the_box_the_kernels_and_the_accelerator():
    record = {
        "cpu_vendor": "AuthenticAMD",
        "cpu": "AMD EPYC 7B13",
        "aten_cpu_capability": "AVX2",
        "pins": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": None},
        "torch": "2.13.0",
        "threads": 1,
        "accelerator": "NVIDIA H200",
    }
    assert numerics_line(record) == (
        "numerics: AuthenticAMD AMD EPYC 7B13, ATen AVX2, ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2, "
        "torch 2.13.0, 1 threads a rank, NVIDIA H200"
    )


def test_what_differs_is_named_field_by_field_and_an_old_state_is_no_difference():
    now = {"cpu_vendor": "GenuineIntel", "cpu": "Xeon", "pins": {"MKL_CBWR": "AVX2"}, "threads": 1}
    assert numerics_differ(dict(now), now) is None
    assert numerics_differ(None, now) is None  # a state saved before runs kept their numerics
    amd = {**now, "cpu_vendor": "AuthenticAMD", "cpu": "EPYC", "pins": {"MKL_CBWR": None}, "threads": 2}
    assert numerics_differ(amd, now) == (
        "cpu: EPYC -> Xeon; cpu_vendor: AuthenticAMD -> GenuineIntel; MKL_CBWR: None -> AVX2; threads: 2 -> 1"
    )


def test_the_eval_table_names_one_record_or_the_rows_of_each():
    from gc25d_core.eval.report import numerics_note

    intel = {"cpu_vendor": "GenuineIntel", "cpu": "Xeon", "aten_cpu_capability": "AVX2", "threads": 1}
    amd = {**intel, "cpu_vendor": "AuthenticAMD", "cpu": "EPYC"}

    def result(label: str, **sweeps: object) -> dict:
        return {"export": {"label": label}, "numerics": sweeps}

    same = [result("sft", clip28=intel), result("stage1_tf", clip28=intel, live240=intel)]
    assert numerics_note(same) == numerics_line(intel)
    mixed = [result("sft", clip28=amd, chain241=amd), result("stage1_tf", clip28=intel, live240=None)]
    assert numerics_note(mixed).splitlines() == [
        "rows computed under other numerics:",
        f"- {numerics_line(amd).removeprefix('numerics: ')}: sft/clip28, sft/chain241",
        f"- {numerics_line(intel).removeprefix('numerics: ')}: stage1_tf/clip28",
        "- not recorded: stage1_tf/live240",
    ]
    assert numerics_note([]) == "" and numerics_note([{"export": {"label": "sft"}}]) == ""


# a fresh process: the dispatch settled, then the first sqrt of 5,184 floats on 2 threads (Adam's
# first step on the tiny VAE's first conv weight), against the correctly rounded one
_FIRST_SQRT = """
import torch
from gc25d_core.numerics import resolve_vml_dispatch
torch.set_num_threads(2)
resolve_vml_dispatch()
x = torch.rand(5184, generator=torch.Generator().manual_seed(0)) * 1e-6
print(int((x.sqrt() != x.double().sqrt().float()).sum()))
"""


def test_the_first_multi_threaded_sqrt_of_a_settled_process_is_correctly_rounded():
    """MKL's first-call dispatch race (pytorch/pytorch#188792): without ``resolve_vml_dispatch`` the
    first sqrt missed in 7 of 30 fresh processes run one after another on this 2-core box (none in
    36 run four at once: the race needs both threads on a core together). With it, none may miss.
    The race cannot be forced, so without the call this fails in most runs, not every one."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-c", _FIRST_SQRT]
    misses = [
        int(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout)
        for _ in range(12)
    ]
    assert misses == [0] * 12, misses


_JOB = """
import sys
import gc25d_core.jobs.common as common
order = []
common.resolve_vml_dispatch = lambda: order.append("settle")
common.run_job(common.base_parser("t"), lambda args, cfg, rep: order.append("main"), sys.argv[1:])
print("order:", ",".join(order))
"""


def test_a_job_settles_the_dispatch_before_its_main(tiny_cfg, tmp_path):
    """Every job's process (jobs/common.run_job, the entry of each torchrun job) settles the
    dispatch before its main computes anything."""
    import subprocess
    import sys

    from gc25d_core.config import write_resolved

    run_dir = tmp_path / "run"
    config = write_resolved(tiny_cfg, run_dir)
    cmd = [sys.executable, "-c", _JOB, "--config", str(config), "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "order: settle,main" in proc.stdout.splitlines(), proc.stdout[-2000:]
