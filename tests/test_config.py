from pathlib import Path

import pytest

from gc25d_core.config import (
    ConfigError,
    Gc25dConfig,
    config_from_yaml,
    load_config,
    parse_overrides,
    write_resolved,
)


def test_v10_defaults_are_the_spec_numbers():
    cfg = load_config("v10")
    g, t = cfg.geometry, cfg.timeline
    assert (g.src_width, g.src_height, g.crop_x0, g.crop_x1, g.dst_width, g.dst_height) == (
        1280,
        704,
        30,
        1250,
        832,
        480,
    )
    assert g.latent_hw == (30, 52)
    assert (t.num_frames, t.num_cells, t.num_blocks, t.clip_stride, t.num_ext_cells, t.num_ext_frames) == (
        81,
        21,
        20,
        96,
        7,
        28,
    )
    assert cfg.vocab == "parts"
    assert (cfg.text.max_len, cfg.text.dim) == (512, 4096)
    assert cfg.distributed.nproc_per_node == 8


def test_precedence_defaults_preset_overrides(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("name: p\nseed: 3\ntimeline: {num_ext_cells: 5}\n")
    cfg = load_config(preset, ["seed=7", "paths.data_root=/x"])
    assert cfg.seed == 7  # override beats preset
    assert cfg.timeline.num_ext_cells == 5  # preset beats default
    assert cfg.timeline.num_frames == 81  # default kept
    assert cfg.paths.data_root == Path("/x")


def test_unknown_key_names_file_and_field(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("geometry: {dst_widht: 832}\n")
    with pytest.raises(ConfigError) as e:
        load_config(preset)
    assert str(preset) in str(e.value) and "geometry.dst_widht" in str(e.value)


def test_invalid_geometry_rejected():
    with pytest.raises(ConfigError, match="multiple of 32"):
        load_config("v10", ["geometry.dst_width=830"])
    with pytest.raises(ConfigError, match="crop"):
        load_config("v10", ["geometry.crop_x1=1300"])


def test_bad_override_and_preset_names():
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_overrides(["seed"])
    with pytest.raises(ConfigError):
        load_config("../etc/passwd")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no_such_preset")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("tiny", ["seed=11"])
    path = write_resolved(cfg, tmp_path / "run")
    assert path == tmp_path / "run" / "config.yaml"
    again = config_from_yaml(path)
    assert again == cfg and isinstance(again, Gc25dConfig)
    assert not list((tmp_path / "run").glob(".tmp-*"))
