"""GC25D_LAUNCHER_CONFIG: which launcher the code location binds, and errors naming file and field."""

import pytest

from gc25d_core.schema import ConfigError
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
