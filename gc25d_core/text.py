"""SPEC §4: prompts from action blocks, and the text-embedding table.

The template, motion phrases and NULL prompt are data files under configs/text/ (DESIGN.md §4.1).
An action block is uint8 [5]:

  col 0 move    0 none, 1 fwd, 2 back, 3 left, 4 right, 5 fwd-left, 6 fwd-right, 7 back-left, 8 back-right
  col 1 run     0/1 (only with a cardinal move; diagonal runs keep their forward/backward component)
  col 2 attack  0 none, 1 light, 2 heavy
  col 3 dodge   0/1
  col 4 stance  0 none, 1 jump, 2 guard

Priority when several are set: attack > dodge > stance > move. The text table maps each of the
19 keys (18 motions + NULL) to bf16 [max_len, dim], zero past the prompt's sequence length;
``key_to_id`` is the sorted key order (must match the deploy side's _KEY_TO_ID).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig, TextConfig
from gc25d_core.hashing import sha256_file
from gc25d_core.timeline import cell_blocks

NULL_KEY = "__null__"
NUM_ACTION_FIELDS = 5
MOVE_KEYS = (
    "idle",
    "walk_forward",
    "walk_backward",
    "walk_left",
    "walk_right",
    "walk_forward_left",
    "walk_forward_right",
    "walk_backward_left",
    "walk_backward_right",
)
RUN_KEYS = {
    1: "run_forward",
    2: "run_backward",
    3: "run_left",
    4: "run_right",
    5: "run_forward",
    6: "run_forward",
    7: "run_backward",
    8: "run_backward",
}
ATTACK_KEYS = {1: "light_attack", 2: "heavy_attack"}
STANCE_KEYS = {1: "jump", 2: "guard"}
FIELD_RANGES = {"move": 8, "run": 1, "attack": 2, "dodge": 1, "stance": 2}


@dataclass(frozen=True)
class TextData:
    template: str
    motions: dict[str, str]
    null_prompt: str

    @property
    def keys(self) -> tuple[str, ...]:
        """The 19 table keys: motion keys + NULL."""
        return tuple(sorted([*self.motions, NULL_KEY]))

    def prompt(self, key: str) -> str:
        if key == NULL_KEY:
            return self.null_prompt
        return self.template.format(motion=self.motions[key])


@lru_cache(maxsize=8)
def load_text_data(data_dir: Path) -> TextData:
    """Read template.txt, motions.json, null_prompt.txt; errors name the file and field."""
    template_path = data_dir / "template.txt"
    template = template_path.read_text(encoding="utf-8").rstrip("\n")
    if template.count("{motion}") != 1:
        raise ValueError(f"{template_path}: template must contain exactly one {{motion}} placeholder")
    motions_path = data_dir / "motions.json"
    motions = json.loads(motions_path.read_text(encoding="utf-8"))
    if not isinstance(motions, dict) or not all(isinstance(v, str) for v in motions.values()):
        raise ValueError(f"{motions_path}: must be an object of motion key -> phrase")
    expected = set(MOVE_KEYS) | set(RUN_KEYS.values()) | set(ATTACK_KEYS.values()) | {"dodge"}
    expected |= set(STANCE_KEYS.values())
    if set(motions) != expected:
        raise ValueError(
            f"{motions_path}: keys differ from the action rule: missing {sorted(expected - set(motions))}, "
            f"unknown {sorted(set(motions) - expected)}"
        )
    null_path = data_dir / "null_prompt.txt"
    return TextData(template, dict(motions), null_path.read_text(encoding="utf-8"))


def text_data(cfg: TextConfig | None = None) -> TextData:
    return load_text_data(Path((cfg or TextConfig()).text_dir))


def check_block(block: Sequence[int] | np.ndarray) -> np.ndarray:
    b = np.asarray(block)
    if b.shape != (NUM_ACTION_FIELDS,):
        raise ValueError(f"action block must have shape [5], got {b.shape}")
    for (name, hi), v in zip(FIELD_RANGES.items(), b.tolist(), strict=True):
        if not 0 <= int(v) <= hi:
            raise ValueError(f"action block field {name}={v} outside 0..{hi}")
    return b


def block_to_key(block: Sequence[int] | np.ndarray) -> str:
    move, run, attack, dodge, stance = (int(v) for v in check_block(block))
    if attack:
        return ATTACK_KEYS[attack]
    if dodge:
        return "dodge"
    if stance:
        return STANCE_KEYS[stance]
    if run and move:
        return RUN_KEYS[move]
    return MOVE_KEYS[move]


def block_to_prompt(block: Sequence[int] | np.ndarray, data: TextData | None = None) -> str:
    return (data or text_data()).prompt(block_to_key(block))


def cell_prompts(blocks20: np.ndarray, data: TextData | None = None) -> list[str]:
    """21 prompts, one per cell (cell 0 = cell 1)."""
    data = data or text_data()
    return [block_to_prompt(b, data) for b in cell_blocks(blocks20)]


def key_to_id(table: Mapping[str, object]) -> dict[str, int]:
    """{k: i for i, k in enumerate(sorted(table))} — the deploy side's _KEY_TO_ID."""
    return {k: i for i, k in enumerate(sorted(table))}


def prompt_to_key(data: TextData) -> dict[str, str]:
    return {data.prompt(k): k for k in data.keys}


def sequence_length(prompt: str) -> int:
    """Token count used by the synthetic table: words + 1 (EOS); the NULL prompt has 1."""
    return len(prompt.split()) + 1


def synthetic_table(cfg: TextConfig, data: TextData | None = None) -> dict[str, torch.Tensor]:
    """Deterministic stand-in for the T5 table with the real shape rules (bf16, zero past length)."""
    data = data or text_data(cfg)
    table: dict[str, torch.Tensor] = {}
    for key in data.keys:
        prompt = data.prompt(key)
        n = min(sequence_length(prompt), cfg.max_len)
        digest = hashlib.sha256(f"{cfg.synthetic_seed}:{key}:{prompt}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        emb = torch.zeros(cfg.max_len, cfg.dim, dtype=torch.float32)
        emb[:n] = torch.randn(n, cfg.dim, generator=gen) * 0.1
        table[key] = emb.to(torch.bfloat16)
    return table


def validate_table(table: object, cfg: TextConfig, data: TextData | None = None, where: str = "text table"):
    """19 keys (motions + NULL), bf16 [max_len, dim], each row block zero past its sequence length."""
    data = data or text_data(cfg)
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a dict of key -> tensor, got {type(table).__name__}")
    expected = set(data.keys)
    if set(table) != expected:
        raise ValueError(
            f"{where}: keys differ: missing {sorted(expected - set(table))}, unknown {sorted(set(table) - expected)}"
        )
    for key in sorted(table):
        t = table[key]
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype != torch.bfloat16
            or tuple(t.shape) != (cfg.max_len, cfg.dim)
        ):
            desc = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{where}[{key!r}]: expected bf16 [{cfg.max_len},{cfg.dim}], got {desc}")
        nonzero = (t != 0).any(dim=1)
        n = int(nonzero.sum())
        if n == 0:
            raise ValueError(f"{where}[{key!r}]: all rows are zero")
        if not bool(nonzero[:n].all()):
            raise ValueError(
                f"{where}[{key!r}]: rows are not zero past the sequence length ({n} non-zero rows)"
            )
    return table


def materialize_table(cfg) -> dict[str, object]:
    """Write <data_root>/text_table_gc25d.pt: a byte copy of the configured table (hash-checked,
    validated before use) or the synthetic table. Returns metadata (keys, shape, sha256, source)."""
    from gc25d_core.atomic import atomic_path, atomic_write_bytes
    from gc25d_core.layout import Layout

    tcfg: TextConfig = cfg.text
    out = Layout(Path(cfg.paths.data_root)).text_table
    data = text_data(tcfg)
    if tcfg.table_path is not None:
        src = Path(tcfg.table_path)
        if not src.is_file():
            raise FileNotFoundError(f"text.table_path {src} does not exist")
        # TextConfig requires the hash with a path; a config built without validation
        # (model_copy / model_construct) must not slip an unverified table through
        if tcfg.table_sha256 is None:
            raise ValueError(f"text.table_sha256 is not set for text.table_path {src}")
        blob = src.read_bytes()  # read once: the bytes hashed are the bytes loaded and copied
        digest = hashlib.sha256(blob).hexdigest()
        if digest != tcfg.table_sha256:
            raise ValueError(f"{src}: sha256 {digest} differs from text.table_sha256 {tcfg.table_sha256}")
        table = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        validate_table(table, tcfg, data, where=str(src))
        atomic_write_bytes(out, blob)
        source = str(src)
    else:
        table = synthetic_table(tcfg, data)
        with atomic_path(out) as tmp:
            torch.save(table, tmp)
        source = "synthetic"
        digest = sha256_file(out)
    return {
        "path": str(out),
        "source": source,
        "num_keys": len(data.keys),
        "shape": [tcfg.max_len, tcfg.dim],
        "sha256": digest,
    }


def load_table(path: Path, cfg: TextConfig) -> dict[str, torch.Tensor]:
    """Read and validate a text table (weights_only)."""
    return validate_table(torch.load(path, map_location="cpu", weights_only=True), cfg, where=str(path))


def load_text_table(cfg: Gc25dConfig, table_path: Path | str | None = None) -> dict[str, torch.Tensor]:
    """The run's text table: ``table_path`` (a training section's ``data.text_table``), else the
    materialised ``<data_root>/text_table_gc25d.pt``, else (synthetic-table presets only) the same
    deterministic synthetic table ``materialize_table`` would have written."""
    from gc25d_core.layout import Layout

    path = table_path or Layout(Path(cfg.paths.data_root)).text_table
    if Path(path).is_file():
        return load_table(Path(path), cfg.text)
    if cfg.text.table_path is None:
        return synthetic_table(cfg.text)
    raise FileNotFoundError(f"text table {path} does not exist (run the text_table stage first)")


def prompt_keys(cfg: Gc25dConfig) -> dict[str, str]:
    """The prompt -> key map of ``cfg``'s text data (what a stored prompt is conditioned as)."""
    return prompt_to_key(text_data(cfg.text))


class TextBank:
    """The text table on the device; per-micro-batch banks of the distinct keys + a cell index."""

    def __init__(self, table: dict[str, torch.Tensor], device: torch.device):
        self.keys = sorted(table)
        self.ids = key_to_id(table)
        self.table = torch.stack([table[k] for k in self.keys]).to(device)  # bf16 [K, L, D]

    def context(self, keys: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, P, L, D] bank of the batch's distinct keys and [B, cells] index into it."""
        uniq = sorted({k for ks in keys for k in ks})
        pos = {k: i for i, k in enumerate(uniq)}
        bank = torch.stack([self.table[self.ids[k]] for k in uniq])  # views + one copy: no H2D sync
        # on the host: the model checks it without a sync
        index = torch.tensor([[pos[k] for k in ks] for ks in keys])
        return bank.unsqueeze(0).expand(len(keys), -1, -1, -1), index
