"""Action blocks from people: a scripted sequence (CLI) and the keys held down (web page).

A block is uint8 [5] in the text.py format (move, run, attack, dodge, stance). Script: a comma
list of ``name`` or ``name*count`` with names from ``NAMED`` or a literal ``m.r.a.d.s`` block,
e.g. ``fwd*8,run_right*4,light*2,idle*3``. Keys (``KeyboardEvent.key``, lower case): W A S D move
(diagonals by two keys), Shift runs, J light attack, K heavy attack, L dodge, Space jump, G guard.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gc25d_core.text import check_block

_MOVES = {"idle": 0, "fwd": 1, "back": 2, "left": 3, "right": 4, "fwd_left": 5, "fwd_right": 6}
_MOVES.update(back_left=7, back_right=8)
NAMED: dict[str, tuple[int, int, int, int, int]] = {name: (m, 0, 0, 0, 0) for name, m in _MOVES.items()}
NAMED.update({f"run_{n}": (m, 1, 0, 0, 0) for n, m in _MOVES.items() if m})
NAMED.update(light=(0, 0, 1, 0, 0), heavy=(0, 0, 2, 0, 0), dodge=(0, 0, 0, 1, 0))
NAMED.update(jump=(0, 0, 0, 0, 1), guard=(0, 0, 0, 0, 2))

# (forward, right) of the held move keys -> move code
_DIRS = {(0, 0): 0, (1, 0): 1, (-1, 0): 2, (0, -1): 3, (0, 1): 4, (1, -1): 5, (1, 1): 6}
_DIRS.update({(-1, -1): 7, (-1, 1): 8})


def parse_script(script: str) -> list[np.ndarray]:
    """``fwd*8,light,1.1.0.0.0*2`` -> blocks; an unknown name or a value out of range names it."""
    blocks: list[np.ndarray] = []
    for raw in script.split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, count = item.partition("*")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"action script item {item!r}: count {count!r} is not an integer") from None
        if n < 1:
            raise ValueError(f"action script item {item!r}: count must be >= 1")
        if name in NAMED:
            block = np.array(NAMED[name], np.uint8)
        elif name.count(".") == 4:
            try:
                values = [int(v) for v in name.split(".")]
            except ValueError:
                raise ValueError(f"action script item {item!r}: not a m.r.a.d.s block of integers") from None
            block = check_block(np.array(values)).astype(np.uint8)
        else:
            raise ValueError(f"action script item {item!r}: unknown action {name!r}; known: {sorted(NAMED)}")
        blocks += [block] * n
    if not blocks:
        raise ValueError("the action script has no actions")
    return blocks


def keys_to_block(keys: Iterable[str]) -> np.ndarray:
    """The block of the keys held now (unknown keys are ignored)."""
    held = {k.lower() for k in keys}
    fwd = ("w" in held) - ("s" in held)
    right = ("d" in held) - ("a" in held)
    move = _DIRS[(fwd, right)]
    attack = 2 if "k" in held else 1 if "j" in held else 0
    stance = 1 if " " in held else 2 if "g" in held else 0
    block = [
        move,
        int("shift" in held and move in (1, 2, 3, 4, 5, 6, 7, 8)),
        attack,
        int("l" in held),
        stance,
    ]
    return check_block(np.array(block)).astype(np.uint8)
