"""Manifest and schema rules that do not need a store."""

from __future__ import annotations

import pytest
import torch

from gc25d_core.cache import SCHEMA_GC25D, ManifestRef, SampleSchemaError, get_schema, validate_sample
from gc25d_core.cache.manifest import (
    check_store_path,
    parse_version_path,
    shard_paths,
    snapshot_id,
    version_path,
)


def _gc(hw=(2, 3), cond_hw=None):
    t = {
        "latent": torch.zeros(48, 21, *hw, dtype=torch.bfloat16),
        "actions_block": torch.zeros(21, 5, dtype=torch.uint8),
    }
    if cond_hw:
        t["cond_ids"] = torch.zeros(81, *cond_hw, dtype=torch.uint8)
    meta = {"clip_id": "c", "subset": "s", "scene": "s", "run": "r", "start": 0, "prompts": ["x"] * 21}
    return t, meta


def test_gc25d_schema_binds_symbols():
    sch = get_schema(SCHEMA_GC25D)
    t, m = _gc((30, 52), (480, 832))
    assert validate_sample(sch, t, m) == {"H": 30, "W": 52, "h": 480, "w": 832}
    with pytest.raises(SampleSchemaError, match="H = 30"):
        validate_sample(sch, *_gc((31, 52)), dims={"H": 30, "W": 52})
    t, m = _gc()
    t["cond_ext_ids"] = torch.zeros(28, 4, 4, dtype=torch.uint8)
    t["cond_ids"] = torch.zeros(81, 5, 4, dtype=torch.uint8)
    with pytest.raises(SampleSchemaError, match="cond_ext_ids: axis 1 = 4 but h = 5"):  # bound by cond_ids
        validate_sample(sch, t, m)
    t, m = _gc()
    m["prompts"] = ["x"] * 20
    with pytest.raises(SampleSchemaError, match="length 20 != 21"):
        validate_sample(sch, t, m)
    with pytest.raises(SampleSchemaError, match="not a Tensor"):
        validate_sample(sch, {**t, "actions_block": [1, 2]}, m)


def test_paths_and_versions():
    assert shard_paths("w0", "w0-000001") == ("shards/w0/w0-000001.tar", "receipts/w0/w0-000001.json")
    assert version_path(123) == "manifests/v000123.json" and snapshot_id(123) == "v000123"
    assert parse_version_path("manifests/v000123.json") == 123
    assert parse_version_path("manifests/v12.json") is None
    for bad in ("../x", "/abs", "a//b", "a/./b", ".hidden/x", "a\\b"):
        with pytest.raises(ValueError):
            check_store_path(bad)
    with pytest.raises(ValueError):
        shard_paths("w/0", "x")


def test_manifest_ref_requires_full_commit():
    with pytest.raises(ValueError, match="40-hex"):
        ManifestRef(version=1, commit="abc1234", sha256="0" * 64)
    with pytest.raises(ValueError, match="40-hex"):
        ManifestRef(version=1, commit="main", sha256="0" * 64)
    ManifestRef(version=1, commit="a" * 40, sha256="0" * 64)


def test_gc25d_sample_from_layout_records():
    import numpy as np

    from gc25d_core.cache import gc25d_sample

    big = torch.zeros(2, 48, 21, 30, 52, dtype=torch.bfloat16)
    rec = {
        "latent": big[1],  # a view: the sample must own its storage
        "actions_block": torch.zeros(21, 5, dtype=torch.uint8),
        "prompts": ["p"] * 21,
        "clip_id": "sc__run1__000096",
        "subset": "v10_real",
        "scene": "sc",
        "run": "run1",
        "start": 96,
    }
    ext = {
        "ids": np.zeros((28, 8, 8), np.uint8),
        "blocks": np.zeros((7, 5), np.uint8),
        "prompts": np.array(["q"] * 7),
    }
    sid, t, m = gc25d_sample(
        rec, cond_ids=np.zeros((81, 8, 8), np.uint8), cond_ext=ext, ext_source="ext_canvas"
    )
    assert sid == "sc__run1__000096" and m["has_ext"] and m["ext_prompts"] == ["q"] * 7
    assert t["latent"].untyped_storage().nbytes() == 48 * 21 * 30 * 52 * 2
    dims = validate_sample(get_schema(SCHEMA_GC25D), t, m)
    assert dims == {"H": 30, "W": 52, "h": 8, "w": 8}


def test_snapshot_id_round_trip():
    from gc25d_core.cache.manifest import parse_snapshot_id, snapshot_id

    for v in (1, 123, 999_999, 1_000_000):
        assert parse_snapshot_id(snapshot_id(v)) == v
    for bad in ("v12345", "v0000001", "x000001", "v000001 ", "v00001a", ""):
        assert parse_snapshot_id(bad) is None
