"""Export (831 bf16 tensors, string metadata) round trip, loader errors, and the full-size meta build."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gc25d_core.models.configs import (
    DEPLOY_CAUSAL,
    NUM_SEM_COND_KEYS,
    NUM_WAN_KEYS_5B,
    WAN22_TI2V_5B_HASH,
    build_meta,
    full_config,
    registry_wan_kwargs,
    tiny_config,
)
from gc25d_core.models.export import ExportError, read_export, save_export
from gc25d_core.models.loading import load_gc_weights
from gc25d_core.models.sem_cond import sem_cond_keys

from .tiny import make_inputs, make_model

AXIS = (1000.0, 937.5, 833.3333, 625.0)


def test_full_meta_build_keys_and_registry_hash():
    from diffsynth.core.loader.file import hash_state_dict_keys

    sd = build_meta(full_config()).state_dict()
    assert len(sd) == NUM_WAN_KEYS_5B + NUM_SEM_COND_KEYS == 831
    sem = set(sem_cond_keys())
    assert sem <= set(sd)
    wan = {k: v for k, v in sd.items() if k not in sem}
    assert hash_state_dict_keys(wan) == WAN22_TI2V_5B_HASH
    assert tuple(sd["gc_sem_cond.proj_in.weight"].shape) == (512, 20, 4, 4, 4)  # 64*K = 1280 in
    assert tuple(sd["gc_sem_cond.proj_out.weight"].shape) == (3072, 512, 1, 1, 1)
    assert full_config().wan_kwargs() == registry_wan_kwargs()
    assert tuple(build_meta(full_config("ids")).state_dict()["gc_sem_cond.proj_in.weight"].shape)[1] == 10


def test_round_trip_bidirectional(tmp_path, tiny_model):
    path = save_export(tmp_path / "sft.safetensors", tiny_model, extra={"step": "1000"})
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
    assert meta["format"] == "gc25d" and meta["arm"] == "gc25d" and meta["sem_cond"] == "gc_sem_cond"
    assert meta["vocab"] == "parts" and meta["data"] == "v10" and meta["causal"] == "false"
    assert meta["step"] == "1000"
    assert keys == set(tiny_model.state_dict()) and not any(k.startswith("dit.") for k in keys)
    sd, parsed = read_export(path)
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    assert parsed.vocab == "parts" and parsed.causal is None and parsed.extra == {"step": "1000"}
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(sd[k], v.to(torch.bfloat16))
    # a model built from the export computes what the bf16-rounded original computes
    loaded, _ = load_gc_weights(path, dtype=torch.float32)
    ref = make_model(seed=0)
    ref.load_state_dict({k: v.float() for k, v in sd.items()})
    latents, context, ids = make_inputs(3, seed=1, per_cell_text=False)
    with torch.no_grad():
        assert torch.equal(loaded(latents, 500.0, context, ids), ref(latents, 500.0, context, ids))
    filled, _ = load_gc_weights(path, make_model(seed=5))
    assert torch.equal(filled.blocks[0].ffn[0].weight, ref.blocks[0].ffn[0].weight)


def test_round_trip_causal_with_dit_prefix(tmp_path, tiny_model):
    prefixed = {f"dit.{k}": v for k, v in tiny_model.state_dict().items()}
    path = save_export(
        tmp_path / "ema.safetensors",
        prefixed,
        dit_config=tiny_model.gc_config,
        causal=DEPLOY_CAUSAL,
        denoise_axis=AXIS,
    )
    meta = safe_open(str(path), framework="pt").metadata()
    assert meta["causal"] == "true" and json.loads(meta["denoise_axis"]) == list(AXIS)
    assert (meta["sink"], meta["window"], meta["rope_cap"]) == ("3", "17", "20")
    _, parsed = read_export(path)
    assert parsed.causal == DEPLOY_CAUSAL and parsed.denoise_axis == AXIS


def test_ids_vocab_detected(tmp_path):
    model = make_model(seed=2, vocab="ids")
    path = save_export(tmp_path / "ids.safetensors", model)
    loaded, meta = load_gc_weights(path)
    assert meta.vocab == "ids" and loaded.vocab == "ids" and loaded.gc_sem_cond.num_classes == 10
    with pytest.raises(ValueError, match="vocab"):
        load_gc_weights(path, make_model(seed=2))


def _rewrite(path, out, sd_fn=lambda sd: sd, meta_fn=lambda m: m):
    sd = load_file(str(path))
    meta = safe_open(str(path), framework="pt").metadata()
    save_file(sd_fn(dict(sd)), str(out), metadata=meta_fn(dict(meta)))
    return out


def test_loader_errors(tmp_path, tiny_model):
    good = save_export(tmp_path / "good.safetensors", tiny_model)

    def drop(sd):
        sd.pop("blocks.1.ffn.2.bias")
        return sd

    def add(sd):
        sd["extra.weight"] = torch.zeros(2, dtype=torch.bfloat16)
        return sd

    def fp32(sd):
        sd["head.head.weight"] = sd["head.head.weight"].float()
        return sd

    cases = [
        (dict(sd_fn=drop), "1 missing keys: blocks.1.ffn.2.bias"),
        (dict(sd_fn=add), "1 unexpected keys: extra.weight"),
        (dict(sd_fn=fp32), "not bf16: head.head.weight"),
        (dict(meta_fn=lambda m: {**m, "format": "other"}), "format='other'"),
        (
            dict(meta_fn=lambda m: {**m, "vocab": "ids"}),
            "metadata vocab='ids' but the sem-cond tensors are vocab 'parts'",
        ),
        (dict(meta_fn=lambda m: {**m, "causal": "true"}), "causal export lacks"),
        (dict(meta_fn=lambda m: {k: v for k, v in m.items() if k != "data"}), "no 'data'"),
        (dict(meta_fn=lambda m: {}), "no metadata"),
    ]
    for i, (kw, msg) in enumerate(cases):
        bad = _rewrite(good, tmp_path / f"bad{i}.safetensors", **kw)
        with pytest.raises(ExportError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            read_export(bad)
    with pytest.raises(ExportError, match="does not exist"):
        read_export(tmp_path / "nope.safetensors")
    with pytest.raises(ExportError, match="both causal"):
        save_export(tmp_path / "x.safetensors", tiny_model, causal=DEPLOY_CAUSAL)
    with pytest.raises(ExportError, match="reserved"):
        save_export(tmp_path / "x.safetensors", tiny_model, extra={"vocab": "ids"})
    with pytest.raises(ExportError, match="vocab argument"):
        save_export(tmp_path / "x.safetensors", tiny_model, vocab="ids")
    assert not (tmp_path / "x.safetensors").exists()


def test_config_inferred_from_shapes(tmp_path):
    from gc25d_core.models.export import infer_dit_config

    cfg = tiny_config(num_layers=1)
    model = make_model(seed=3, num_layers=1)
    sd = dict(model.state_dict())
    assert infer_dit_config(sd, num_heads=2) == cfg
    assert infer_dit_config(build_meta(full_config("ids")).state_dict()) == full_config("ids")
    # an export without dit_config metadata (e.g. written elsewhere) is read by inference
    path = save_export(tmp_path / "m.safetensors", sd, dit_config=cfg)
    legacy = _rewrite(
        path,
        tmp_path / "legacy.safetensors",
        meta_fn=lambda m: {k: v for k, v in m.items() if k != "dit_config"},
    )
    _, parsed = read_export(legacy)
    assert parsed.dit_config.num_layers == 1 and parsed.dit_config.dim == 96
