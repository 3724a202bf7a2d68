import re
from pathlib import Path

import pytest

from gc25d_core.config import (
    ConfigError,
    Gc25dConfig,
    config_from_yaml,
    load_config,
    parse_overrides,
    read_yaml,
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


# --- every preset in configs/ loads and validates ------------------------------------------------

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
PRESET_FILES = sorted(CONFIG_DIR.rglob("*.yaml"))


def _validate_preset(path: Path) -> None:
    """A top-level preset is a whole config; configs/<stage>/<name>.yaml is that stage's section of it."""
    from gc25d_core.train.presets import STAGES, stage_config, with_stage

    folder = path.parent.relative_to(CONFIG_DIR).as_posix()
    if folder == ".":
        load_config(path)
    elif folder in STAGES:
        stage_config(with_stage(load_config("tiny"), folder, read_yaml(path)), folder)
    else:  # a new kind of preset needs a rule here, so that it is checked too
        raise AssertionError(f"{path}: no validation rule for presets in configs/{folder}/")


def test_preset_glob_finds_the_presets():
    names = {p.relative_to(CONFIG_DIR).as_posix() for p in PRESET_FILES}
    assert {"tiny.yaml", "v10.yaml", "sft/tiny.yaml", "sft/v10.yaml"} <= names


@pytest.mark.parametrize(
    "path", PRESET_FILES, ids=[p.relative_to(CONFIG_DIR).as_posix() for p in PRESET_FILES]
)
def test_every_preset_loads_and_validates(path):
    _validate_preset(path)


# --- the text table's hash ------------------------------------------------------------------------


def test_text_table_path_without_sha256_fails_to_load(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("text: {table_path: /data/text_table_gc25d.pt}\n")
    with pytest.raises(
        ConfigError, match=r"text\.table_sha256: .*required when text\.table_path is set"
    ) as e:
        load_config(preset)
    assert str(preset) in str(e.value)
    with pytest.raises(ConfigError, match=r"override text\.table_sha256=null: .*required"):
        load_config(preset, ["text.table_sha256=null"])
    with pytest.raises(ConfigError, match=r"text\.table_sha256"):
        load_config("tiny", ["text.table_path=/data/t.pt"])


def test_text_table_sha256_must_be_a_lowercase_hex_digest(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("text: {table_path: /data/t.pt, table_sha256: abc123}\n")
    with pytest.raises(ConfigError, match=r"text\.table_sha256: String should match pattern"):
        load_config(preset)
    ok = load_config(preset, [f"text.table_sha256={'ab' * 32}"])
    assert ok.text.table_sha256 == "ab" * 32 and ok.text.table_path == Path("/data/t.pt")
    assert load_config("tiny").text.table_path is None  # no table: no hash needed (synthetic table)


def test_v10_sets_the_table_hash_placeholder():
    text = load_config("v10").text
    assert text.table_path is not None and text.table_sha256 == "0" * 64


# --- override errors name the override and the field ------------------------------------------------


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("=5", "the key before '=' is empty"),
        ("  =5", "the key before '=' is empty"),
        ("cache..store=x", "key 'cache..store' has an empty part (number 2)"),
        ("a.=1", "key 'a.' has an empty part (number 2)"),
        (".seed=1", "key '.seed' has an empty part (number 1)"),
    ],
)
def test_override_with_an_empty_key_part_is_named(override, says):
    with pytest.raises(ConfigError) as e:
        parse_overrides(["seed=1", override])
    assert str(e.value).startswith(f"override {override!r}: ") and says in str(e.value)
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config("tiny", [override])


@pytest.mark.parametrize("override", ["index.val_runs=[a, b", "sft={x: 1", 'name="open', "seed=@1"])
def test_override_with_malformed_yaml_names_override_and_field(override):
    key = override.split("=", 1)[0]
    with pytest.raises(ConfigError) as e:
        parse_overrides([override])
    msg = str(e.value)
    assert msg.startswith(f"override {override!r}: the value of {key} is not valid YAML (")
    assert "line" not in msg  # no parser position that points into a string the user never wrote
    with pytest.raises(ConfigError, match=re.escape(f"override {override!r}")):
        load_config("tiny", [override])


def test_override_into_a_value_names_the_section():
    with pytest.raises(ConfigError, match=r"override 'seed\.x=1': 'seed' is not a section"):
        parse_overrides(["seed=1", "seed.x=1"])
    with pytest.raises(ConfigError, match=r"'index\.val_runs' is not a section"):
        parse_overrides(["index.val_runs=[a]", "index.val_runs.x=1"])
