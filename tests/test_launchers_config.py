"""GC25D_LAUNCHER_CONFIG: which launcher the code location binds, and errors naming file and field."""

import subprocess

import pytest
import yaml

from gc25d_core.schema import ConfigError
from gc25d_pipeline.lib.launcher import PreparedLaunch
from gc25d_pipeline.lib.launchers import launcher_from_env, load_launcher
from gc25d_pipeline.lib.slurm import SlurmLauncher
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


def test_default_is_one_node_torchrun(tiny_cfg, monkeypatch):
    monkeypatch.delenv("GC25D_LAUNCHER_CONFIG", raising=False)
    launcher = launcher_from_env(tiny_cfg)
    assert type(launcher) is TorchrunLauncher and launcher.nnodes == 1
    assert launcher.nproc_per_node == tiny_cfg.distributed.nproc_per_node


def test_slurm_from_file_keeps_preset_defaults(tiny_cfg, tmp_path, monkeypatch):
    path = tmp_path / "launcher.yaml"
    path.write_text("kind: slurm\nnnodes: 2\npartition: h200\n")
    monkeypatch.setenv("GC25D_LAUNCHER_CONFIG", str(path))
    launcher = launcher_from_env(tiny_cfg)
    assert isinstance(launcher, SlurmLauncher) and launcher.nnodes == 2 and launcher.partition == "h200"
    assert launcher.nproc_per_node == tiny_cfg.distributed.nproc_per_node


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("kind: lsf\n", "field 'kind' is 'lsf'"),
        ("kind: slurm\npartitoin: x\n", r"unknown field\(s\) \['partitoin'\]"),
        ("kind: slurm\nnnodes: many\n", "field nnodes"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_bad_files_name_the_file_and_field(tiny_cfg, tmp_path, text, match):
    path = tmp_path / "launcher.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as err:
        load_launcher(path, tiny_cfg)
    assert str(path) in str(err.value)


# Hostile values, each refused at load with the file and the field named. Without the checks each
# of them reached the sbatch script: a newline ends the #SBATCH comment and runs the rest as a
# command, a space in partition adds an sbatch option, an env name with '$(' or ';' runs in export.
HOSTILE = [
    ("slurm", "partition", "h200\ntouch /tmp/pwned"),
    ("slurm", "partition", "h200 --uid=0"),
    ("slurm", "partition", "h200,"),
    ("slurm", "account", "proj\necho pwned"),
    ("slurm", "account", "a b"),
    ("slurm", "time_limit", "1:00\necho pwned"),
    ("slurm", "time_limit", "1 day"),
    ("slurm", "time_limit", "-1"),
    ("slurm", "mem", "0\necho pwned"),
    ("slurm", "mem", "10GB"),
    ("slurm", "sbatch_args", ["--comment=x\necho pwned"]),
    ("slurm", "sbatch_args", ["--exclusive --uid=0"]),
    ("slurm", "sbatch_args", ["-C a100"]),
    ("slurm", "sbatch_args", ["echo pwned"]),
    ("slurm", "extra_env", {"A;touch /tmp/pwned;B": "1"}),
    ("slurm", "extra_env", {"$(touch /tmp/pwned)": "1"}),
    ("torchrun", "extra_env", {"1ABC": "1"}),
    ("kubernetes", "extra_env", {"A-B": "1"}),
    ("slurm", "slurm_bin", "../../tmp/bin"),
    ("slurm", "slurm_bin", "bin"),
    ("slurm", "slurm_bin", "/opt/slurm/../../tmp"),
    ("slurm", "rdzv_port", 70000),
    ("slurm", "rdzv_port", -1),
    ("slurm", "nnodes", 0),
    ("slurm", "nproc_per_node", -3),
    ("slurm", "gpus_per_node", -1),
    ("slurm", "cpus_per_task", 0),
    ("slurm", "poll_interval_s", 0),
    ("torchrun", "nnodes", 0),
    ("torchrun", "nproc_per_node", -3),
    ("torchrun", "max_restarts", -1),
    ("torchrun", "rdzv_endpoint", "127.0.0.1:70000"),
    ("torchrun", "rdzv_endpoint", "host;x:29500"),
    ("kubernetes", "nnodes", 0),
    ("kubernetes", "rdzv_port", 70000),
    ("kubernetes", "rdzv_port", 0),
    ("kubernetes", "workdir", "opt/gc25d"),
    ("kubernetes", "workdir", "/opt/../etc"),
    ("kubernetes", "shared_mount", "shared"),
    ("kubernetes", "active_deadline_s", 0),
]


@pytest.mark.parametrize(("kind", "field", "value"), HOSTILE, ids=lambda v: repr(v)[:40])
def test_hostile_values_are_refused_at_load(tiny_cfg, tmp_path, kind, field, value):
    path = tmp_path / "launcher.yaml"
    path.write_text(yaml.safe_dump({"kind": kind, field: value}))
    with pytest.raises(ConfigError) as err:
        load_launcher(path, tiny_cfg)
    assert str(path) in str(err.value) and f"field {field}" in str(err.value), err.value


LEGAL = {
    "partition": "h200,cpu-2.x",
    "account": "proj_a.b-c",
    "time_limit": "7-00:00:00",
    "mem": "0",
    "sbatch_args": ["--exclusive", "--comment=a 'quoted' # comment $(not run)", "--constraint=a100&nvlink"],
    "extra_env": {"NCCL_DEBUG": "INFO", "_X1": "a'b\n$(not run)"},
    "slurm_bin": "/opt/slurm/bin",
    "rdzv_port": 29500,
    "cpus_per_task": 4,
    "gpus_per_node": 8,
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("time_limit", "90"),
        ("time_limit", "90:30"),
        ("time_limit", "12:00:00"),
        ("time_limit", "2-12"),
        ("time_limit", "2-12:30"),
        ("time_limit", "UNLIMITED"),
        ("mem", "512G"),
        ("mem", "64000"),
        ("partition", "gpu"),
    ],
)
def test_legal_slurm_values_load(tiny_cfg, tmp_path, field, value):
    path = tmp_path / "launcher.yaml"
    path.write_text(yaml.safe_dump({"kind": "slurm", field: value}))
    assert getattr(load_launcher(path, tiny_cfg), field) == value


def test_script_with_every_field_set_is_valid_bash_that_runs_nothing_it_should_not(tiny_cfg, tmp_path):
    """The generated sbatch script with legal but awkward values (quotes, '#', '$(', a newline in an
    env value): bash parses it, and running its exports alone sets the values verbatim."""
    path = tmp_path / "launcher.yaml"
    path.write_text(yaml.safe_dump({"kind": "slurm", "nnodes": 2, **LEGAL}))
    launcher = load_launcher(path, tiny_cfg)
    assert isinstance(launcher, SlurmLauncher)
    run_dir = tmp_path / "run dir"
    launch = PreparedLaunch(run_dir, run_dir / "config.yaml", run_dir / "logs", run_dir / "pipes", [])
    launch.log_dir.mkdir(parents=True)
    env = launcher.job_env(0)
    script = launcher.script("gc25d_core.jobs.cluster_check", launch, env, "gc25d-x")
    (tmp_path / "job.sbatch").write_text(script)
    check = subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    for node_or_job in (tmp_path / "job.sbatch", launch.log_dir / "node.sh"):
        check = subprocess.run(["bash", "-n", str(node_or_job)], capture_output=True, text=True)
        assert check.returncode == 0, (node_or_job, check.stderr)
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert "#SBATCH --partition=h200,cpu-2.x" in sbatch and "#SBATCH --time=7-00:00:00" in sbatch
    assert "#SBATCH '--constraint=a100&nvlink'" in sbatch
    # the script up to its exports, run by bash: the #SBATCH lines stay comments, every value
    # arrives verbatim and nothing in them executes
    head = script.split('export GC25D_RDZV_HOST="', 1)[0]
    out = subprocess.run(
        ["bash", "-c", f'{head}\nprintf %s "$_X1"'], capture_output=True, text=True, check=True
    )
    assert out.stdout == "a'b\n$(not run)" and out.stderr == ""
