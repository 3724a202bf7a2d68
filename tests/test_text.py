import numpy as np
import pytest
import torch

from gc25d_core.config import TextConfig
from gc25d_core.text import (
    NULL_KEY,
    block_to_key,
    block_to_prompt,
    cell_prompts,
    key_to_id,
    materialize_table,
    synthetic_table,
    text_data,
    validate_table,
)

CFG = TextConfig(dim=64)


def test_text_data_has_19_keys():
    data = text_data(CFG)
    assert len(data.keys) == 19 and NULL_KEY in data.keys
    assert data.prompt(NULL_KEY) == data.null_prompt
    assert "{motion}" not in data.prompt("walk_forward") and "walks forward" in data.prompt("walk_forward")


def test_block_rule_priorities():
    assert block_to_key([0, 0, 0, 0, 0]) == "idle"
    assert block_to_key([1, 0, 0, 0, 0]) == "walk_forward"
    assert block_to_key([8, 0, 0, 0, 0]) == "walk_backward_right"
    assert block_to_key([3, 1, 0, 0, 0]) == "run_left"
    assert block_to_key([5, 1, 0, 0, 0]) == "run_forward"  # diagonal run keeps its forward part
    assert block_to_key([1, 1, 2, 1, 1]) == "heavy_attack"  # attack > dodge > stance > move
    assert block_to_key([1, 1, 0, 1, 2]) == "dodge"
    assert block_to_key([1, 0, 0, 0, 2]) == "guard"
    with pytest.raises(ValueError, match="move=9"):
        block_to_key([9, 0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"shape \[5\]"):
        block_to_key([0, 0, 0])


def test_cell_prompts_cell0_equals_cell1():
    blocks = np.zeros((20, 5), np.uint8)
    blocks[:, 0] = [1, 2, 3, 4] * 5
    prompts = cell_prompts(blocks)
    assert len(prompts) == 21
    assert prompts[0] == prompts[1] == block_to_prompt(blocks[0])
    assert prompts[20] == block_to_prompt(blocks[19])


def test_key_to_id_is_sorted_order():
    table = {"b": 0, "a": 0, "__null__": 0, "c": 0}
    assert key_to_id(table) == {"__null__": 0, "a": 1, "b": 2, "c": 3}
    ids = key_to_id(synthetic_table(CFG))
    assert list(ids.values()) == list(range(19)) and list(ids) == sorted(ids)


def test_synthetic_table_shape_rules_and_determinism():
    t1, t2 = synthetic_table(CFG), synthetic_table(CFG)
    validate_table(t1, CFG)
    for k in t1:
        assert torch.equal(t1[k], t2[k])
        assert t1[k].dtype == torch.bfloat16 and tuple(t1[k].shape) == (512, 64)
    assert not torch.equal(t1["idle"], t1["dodge"])
    assert int((t1[NULL_KEY] != 0).any(1).sum()) == 1  # NULL: one token (EOS)


def test_validate_table_rejects_bad_tables():
    good = synthetic_table(CFG)
    bad = dict(good)
    bad.pop("idle")
    with pytest.raises(ValueError, match="missing \\['idle'\\]"):
        validate_table(bad, CFG)
    bad = dict(good)
    bad["idle"] = good["idle"].float()
    with pytest.raises(ValueError, match="idle"):
        validate_table(bad, CFG)
    hole = good["idle"].clone()
    hole[400] = 1.0  # non-zero row past the sequence length
    with pytest.raises(ValueError, match="zero past the sequence length"):
        validate_table({**good, "idle": hole}, CFG)


def test_materialize_table_copies_a_configured_table_after_hash_check(tiny_cfg, tmp_path):
    src = tmp_path / "table.pt"
    torch.save(synthetic_table(tiny_cfg.text), src)
    import hashlib

    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    cfg = tiny_cfg.model_copy(
        update={"text": tiny_cfg.text.model_copy(update={"table_path": src, "table_sha256": digest})}
    )
    out = materialize_table(cfg)
    assert out["source"] == str(src) and out["sha256"] == digest  # byte-identical copy
    wrong = cfg.model_copy(update={"text": cfg.text.model_copy(update={"table_sha256": "0" * 64})})
    with pytest.raises(ValueError, match="sha256"):
        materialize_table(wrong)
    synth = materialize_table(tiny_cfg)
    assert synth["source"] == "synthetic" and synth["num_keys"] == 19


def _with_table(tiny_cfg, table, sha):
    """tiny_cfg with a text table file, resolved through load_config (the validated path)."""
    from gc25d_core.config import load_config

    overrides = {
        "paths": {"data_root": str(tiny_cfg.paths.data_root)},
        "text": {"table_path": str(table), "table_sha256": sha},
    }
    return load_config("tiny", overrides)


def test_configured_table_is_used_only_with_its_sha256(tiny_cfg, tmp_path):
    import hashlib

    src = tmp_path / "table.pt"
    torch.save(synthetic_table(tiny_cfg.text), src)
    real = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tiny_cfg.paths.data_root / "text_table_gc25d.pt"
    for wrong in ("0" * 64, real[::-1]):  # the v10 placeholder, and another digest
        with pytest.raises(ValueError) as e:
            materialize_table(_with_table(tiny_cfg, src, wrong))
        assert str(src) in str(e.value) and real in str(e.value) and wrong in str(e.value)
        assert not out.exists()  # nothing unverified reaches the data root
    meta = materialize_table(_with_table(tiny_cfg, src, real))
    assert meta["source"] == str(src) and meta["sha256"] == real
    assert out.read_bytes() == src.read_bytes()


def test_table_path_without_sha256_is_refused_even_unvalidated(tiny_cfg, tmp_path):
    """model_copy skips validation; materialize_table still refuses a table it cannot verify."""
    src = tmp_path / "table.pt"
    torch.save(synthetic_table(tiny_cfg.text), src)
    cfg = tiny_cfg.model_copy(update={"text": tiny_cfg.text.model_copy(update={"table_path": src})})
    with pytest.raises(ValueError, match=r"text\.table_sha256 is not set"):
        materialize_table(cfg)
