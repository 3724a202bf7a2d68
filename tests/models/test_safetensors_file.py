"""The project's safetensors writer gives the same bytes for the same tensors and metadata in every
process (safetensors alone orders its header's maps at random per process), and the file reads back."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import torch
from safetensors import safe_open

from gc25d_core.models.safetensors_file import canonical_header

WRITE = """
import sys, torch
from {module} import {fn}
t = {{"b.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.ones(4, dtype=torch.bfloat16)}}
meta = {{"format": "gc25d", "dim": "16", "vocab": "parts", "zeta": "é", "data": "v10"}}
{call}
"""


def _digests(tmp_path, module: str, fn: str, call: str, n: int = 4) -> set[str]:
    out = set()
    for i in range(n):
        path = tmp_path / f"f{i}.safetensors"
        code = WRITE.format(module=module, fn=fn, call=call.format(path=str(path)))
        subprocess.run([sys.executable, "-c", code], check=True)
        out.add(hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def test_one_file_for_the_same_tensors_and_metadata_in_every_process(tmp_path):
    digests = _digests(
        tmp_path,
        "gc25d_core.models.safetensors_file",
        "save_safetensors",
        "save_safetensors(t, {path!r}, meta)",
    )
    assert len(digests) == 1
    with safe_open(str(tmp_path / "f0.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "gc25d", "dim": "16", "vocab": "parts", "zeta": "é", "data": "v10"}
        assert torch.equal(f.get_tensor("b.weight"), torch.arange(6.0).reshape(2, 3))
        assert f.get_tensor("a.bias").dtype == torch.bfloat16


def test_plain_save_file_is_what_the_writer_fixes(tmp_path):
    """The library's own writer varies across processes (why the project's writer exists): if this
    ever gives one digest, the canonical rewrite can go."""
    digests = _digests(
        tmp_path, "safetensors.torch", "save_file", "save_file(t, {path!r}, metadata=meta)", n=6
    )
    assert len(digests) > 1


def test_the_canonical_header_keeps_its_length():
    raw = b'{"z":{"b":"1","a":"2"},"a":[1,2]}   '
    out = canonical_header(raw)
    assert len(out) == len(raw) and out.rstrip() == b'{"a":[1,2],"z":{"a":"2","b":"1"}}'
