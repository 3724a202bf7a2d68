"""SPEC §3: raw semantic ids and the "parts" (K=20) / "ids" (K=10) vocabularies.

Raw values (uint8 per pixel):
  static  0 sky, 1 terrain, 2 paving, 3 architecture, 4 rock, 5 vegetation, 6 prop
  player  10 core, 12 l_arm, 13 r_arm, 14 l_leg, 15 r_leg, 16 weapon
  boss    11 core, 17 l_arm, 18 r_arm, 19 l_leg, 20 r_leg, 21 weapon
  255     UNKNOWN

A vocabulary's classes are its valid raw values in ascending order, UNKNOWN included (so UNKNOWN is
the last class): "parts" has 7 + 12 + 1 = 20 classes, "ids" 7 + 2 + 1 = 10.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Vocab = Literal["parts", "ids"]
VOCABS: tuple[Vocab, ...] = ("parts", "ids")

STATIC_IDS: dict[int, str] = {
    0: "sky",
    1: "terrain",
    2: "paving",
    3: "architecture",
    4: "rock",
    5: "vegetation",
    6: "prop",
}
NUM_STATIC = len(STATIC_IDS)  # static ids are exactly 0..NUM_STATIC-1
PART_NAMES: tuple[str, ...] = ("core", "l_arm", "r_arm", "l_leg", "r_leg", "weapon")
PLAYER_PART_IDS: tuple[int, ...] = (10, 12, 13, 14, 15, 16)
BOSS_PART_IDS: tuple[int, ...] = (11, 17, 18, 19, 20, 21)
PLAYER_CORE, BOSS_CORE = 10, 11
UNKNOWN = 255
CHARACTER_IDS: frozenset[int] = frozenset(PLAYER_PART_IDS + BOSS_PART_IDS)


def valid_raw_ids(vocab: Vocab = "parts") -> tuple[int, ...]:
    """The raw values a condition may hold under ``vocab``, ascending (UNKNOWN last)."""
    if vocab == "parts":
        values = set(STATIC_IDS) | set(PLAYER_PART_IDS) | set(BOSS_PART_IDS) | {UNKNOWN}
    elif vocab == "ids":
        values = set(STATIC_IDS) | {PLAYER_CORE, BOSS_CORE, UNKNOWN}
    else:
        raise ValueError(f"unknown vocab {vocab!r}; expected one of {VOCABS}")
    return tuple(sorted(values))


def num_classes(vocab: Vocab = "parts") -> int:
    return len(valid_raw_ids(vocab))


def raw_to_class_map(vocab: Vocab = "parts") -> dict[int, int]:
    """raw value -> class index (position in ``valid_raw_ids``)."""
    return {raw: i for i, raw in enumerate(valid_raw_ids(vocab))}


def _lut(vocab: Vocab) -> np.ndarray:
    lut = np.full(256, -1, dtype=np.int16)
    for raw, cls in raw_to_class_map(vocab).items():
        lut[raw] = cls
    return lut


_LUTS = {v: _lut(v) for v in VOCABS}


def invalid_values(ids: np.ndarray, vocab: Vocab = "parts") -> list[int]:
    """Sorted raw values in ``ids`` that ``vocab`` does not contain."""
    ids = np.asarray(ids)
    if ids.dtype == np.uint8:  # a 256-bin count instead of a sort (cond ids: 32M values a clip)
        present = np.flatnonzero(np.bincount(ids.ravel(), minlength=256))
    else:
        present = np.unique(ids)
    lut = _LUTS[vocab]
    bad = [int(v) for v in present if not (0 <= int(v) <= 255) or lut[int(v)] < 0]
    return bad


def check_ids(ids: np.ndarray, vocab: Vocab = "parts", where: str = "ids") -> None:
    """Raise ValueError listing every value of ``ids`` outside ``vocab``."""
    bad = invalid_values(ids, vocab)
    if bad:
        raise ValueError(
            f"{where}: values {bad} are outside vocab {vocab!r} (valid: {list(valid_raw_ids(vocab))})"
        )


def raw_to_class(ids: np.ndarray, vocab: Vocab = "parts", where: str = "ids") -> np.ndarray:
    """Map raw ids (any integer array) to class indices int64; errors list the invalid values."""
    ids = np.asarray(ids)
    check_ids(ids, vocab, where)
    return _LUTS[vocab][ids.astype(np.intp)].astype(np.int64)


_COLLAPSE = np.arange(256, dtype=np.uint8)
_COLLAPSE[list(PLAYER_PART_IDS)] = PLAYER_CORE
_COLLAPSE[list(BOSS_PART_IDS)] = BOSS_CORE


def collapse_parts(ids: np.ndarray) -> np.ndarray:
    """ "parts" -> "ids": 12..16 -> 10 and 17..21 -> 11; every other value unchanged (uint8)."""
    ids = np.asarray(ids)
    check_ids(ids, "parts", "collapse_parts input")
    return _COLLAPSE[ids.astype(np.intp)]


def to_vocab(ids_parts: np.ndarray, vocab: Vocab) -> np.ndarray:
    """Stored conditions are "parts" raw ids; convert them to ``vocab``'s raw ids."""
    return collapse_parts(ids_parts) if vocab == "ids" else np.asarray(ids_parts)
