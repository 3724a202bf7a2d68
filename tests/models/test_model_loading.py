"""Wan shard loading: sha256 before use, registry key hash from headers, fp32 -> bf16, only sem-cond
keys missing. Tiny shards stand in for the real 3 fp32 shards (their key hash is passed explicitly)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from gc25d_core.models.configs import WAN22_TI2V_5B_HASH, tiny_config
from gc25d_core.models.loading import (
    WeightsError,
    build_gcdit_from_wan,
    check_wan_keys,
    key_hash_of_files,
    load_gc_weights,
    load_wan_into,
    load_wan_state_dict,
    sha256_file,
    wan_shard_paths,
)
from gc25d_core.models.sem_cond import sem_cond_keys

from .tiny import make_inputs, make_model


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory):
    """A plain tiny WanModel saved like the release: 3 fp32 shards + index json."""
    from diffsynth.models.wan_video_dit import WanModel

    torch.manual_seed(3)
    wan = WanModel(**tiny_config().wan_kwargs())
    sd = {k: v.contiguous() for k, v in wan.state_dict().items()}
    keys = sorted(sd)
    root = tmp_path_factory.mktemp("wan")
    names = [f"diffusion_pytorch_model-0000{i + 1}-of-00003.safetensors" for i in range(3)]
    weight_map = {}
    for i, name in enumerate(names):
        part = {k: sd[k] for k in keys[i::3]}
        save_file(part, str(root / name))
        weight_map.update({k: name for k in part})
    (root / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    paths = wan_shard_paths(root)
    return wan, paths, {p.name: sha256_file(p) for p in paths}


def test_shards_load_verified_as_bf16(tiny_shards):
    wan, paths, digests = tiny_shards
    assert [p.name for p in paths] == sorted(digests)
    key_hash = key_hash_of_files(paths)
    assert key_hash != WAN22_TI2V_5B_HASH
    sd = load_wan_state_dict(paths, expected_sha256=digests, expected_key_hash=key_hash)
    assert set(sd) == set(wan.state_dict()) and all(v.dtype == torch.bfloat16 for v in sd.values())
    model = make_model(seed=1)
    load_wan_into(model, sd)
    assert torch.equal(model.blocks[1].ffn[2].weight, wan.blocks[1].ffn[2].weight.to(torch.bfloat16).float())


def test_shard_verification_errors(tiny_shards, tmp_path):
    wan, paths, digests = tiny_shards
    key_hash = key_hash_of_files(paths)
    with pytest.raises(WeightsError, match="sha256 .* != expected"):
        load_wan_state_dict(
            paths, expected_sha256={**digests, paths[0].name: "0" * 64}, expected_key_hash=key_hash
        )
    with pytest.raises(WeightsError, match="no expected sha256"):
        load_wan_state_dict(paths, expected_sha256={}, expected_key_hash=key_hash)
    # the default expects the real 5B layout: the tiny shards fail the registry hash
    with pytest.raises(WeightsError, match=f"expected {WAN22_TI2V_5B_HASH}"):
        load_wan_state_dict(paths, expected_sha256=digests)
    with pytest.raises(WeightsError, match="incomplete shard set"):
        load_wan_state_dict(paths[:2], expected_sha256=digests, expected_key_hash=key_hash)
    with pytest.raises(WeightsError, match="missing"):
        load_wan_state_dict([tmp_path / paths[0].name], expected_sha256=digests, expected_key_hash=key_hash)
    with pytest.raises(WeightsError, match="no diffusion_pytorch_model"):
        wan_shard_paths(tmp_path)


def test_only_sem_cond_keys_may_be_missing():
    model_keys = set(make_model(seed=0).state_dict())
    wan_keys = model_keys - set(sem_cond_keys())
    check_wan_keys(model_keys, wan_keys)
    with pytest.raises(WeightsError, match="missing"):
        check_wan_keys(model_keys, wan_keys - {"head.modulation"})
    with pytest.raises(WeightsError, match="unexpected"):
        check_wan_keys(model_keys, wan_keys | {"img_emb.proj.0.weight"})


def test_build_from_wan_is_the_plain_model_at_init(tiny_shards, tmp_path):
    from diffsynth.pipelines.wan_video import model_fn_wan_video

    wan, paths, digests = tiny_shards
    model = build_gcdit_from_wan(
        paths,
        expected_sha256=digests,
        cfg=tiny_config(),
        expected_key_hash=key_hash_of_files(paths),
        dtype=torch.float32,
    )
    assert torch.count_nonzero(model.gc_sem_cond.proj_out.weight) == 0
    assert torch.count_nonzero(model.gc_sem_cond.proj_in.weight) > 0
    latents, context, ids = make_inputs(3, seed=2, per_cell_text=False)
    wan_bf16 = copy.deepcopy(wan).to(torch.bfloat16).float()
    with torch.no_grad():
        ref = model_fn_wan_video(
            dit=wan_bf16,
            latents=latents,
            timestep=torch.tensor([500.0]),
            context=context,
            fuse_vae_embedding_in_latents=True,
        )
        assert torch.equal(model(latents, 500.0, context, ids), ref)
    # export -> sha-checked load_gc_weights
    from gc25d_core.models.export import save_export

    path = save_export(tmp_path / "init.safetensors", model)
    with pytest.raises(WeightsError, match="sha256"):
        load_gc_weights(path, expected_sha256="0" * 64)
    loaded, meta = load_gc_weights(path, expected_sha256=sha256_file(path))
    assert meta.vocab == "parts" and loaded.patch_embedding.weight.dtype == torch.bfloat16
