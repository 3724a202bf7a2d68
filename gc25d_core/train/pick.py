"""SPEC §10 teacher pick: among steps >= ``min_step`` (6000), the lowest mean cond val MSE; then the
latest step whose MSE is within ``rel_tol`` (0.5 %) of that lowest one.

Only steps that have an export (``exports/step-NNNNNN.safetensors``) are candidates when the run
folder is given: validation runs every 500 steps, exports every 1000. Scores that are NaN or
infinite are ignored. No torch import: the Dagster side calls this directly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_MIN_STEP = 6000
DEFAULT_REL_TOL = 0.005
DEFAULT_METRIC = "cond_mse"
_EXPORT = re.compile(r"^step-(\d+)\.safetensors$")


class PickError(ValueError):
    """No step qualifies for the pick (none >= min_step with a finite score and an export)."""


@dataclass(frozen=True)
class SftPick:
    step: int
    score: float
    best_step: int
    best_score: float
    threshold: float
    candidates: tuple[tuple[int, float], ...]  # (step, score) of every step within the threshold
    min_step: int
    rel_tol: float
    path: Path | None = field(default=None, compare=False)

    def metadata(self) -> dict[str, object]:
        return {
            "step": self.step,
            "score": self.score,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "threshold": self.threshold,
            "candidates": [list(c) for c in self.candidates],
            "min_step": self.min_step,
            "rel_tol": self.rel_tol,
            "path": None if self.path is None else str(self.path),
        }


def pick_sft(
    scores: Mapping[int, float],
    *,
    min_step: int = DEFAULT_MIN_STEP,
    rel_tol: float = DEFAULT_REL_TOL,
    available: Iterable[int] | None = None,
) -> SftPick:
    """``scores``: step -> mean cond val MSE. ``available``: steps that may be picked (default all)."""
    if rel_tol < 0:
        raise ValueError(f"rel_tol={rel_tol} must be >= 0")
    allowed = None if available is None else set(available)
    eligible = {
        int(s): float(v)
        for s, v in scores.items()
        if int(s) >= min_step and math.isfinite(float(v)) and (allowed is None or int(s) in allowed)
    }
    if not eligible:
        have = sorted(int(s) for s in scores)
        raise PickError(
            f"no step >= {min_step} with a finite score"
            + ("" if allowed is None else " and an export")
            + f" (scored steps: {have[:6]}{' ...' if len(have) > 6 else ''})"
        )
    best_step = min(eligible, key=lambda s: (eligible[s], s))
    best = eligible[best_step]
    threshold = best * (1.0 + rel_tol) if best >= 0 else best * (1.0 - rel_tol)
    within = sorted((s, v) for s, v in eligible.items() if v <= threshold)
    step, score = within[-1]
    return SftPick(step, score, best_step, best, threshold, tuple(within), min_step, rel_tol)


def read_val_scores(run_dir: Path | str, metric: str = DEFAULT_METRIC) -> dict[int, float]:
    """step -> ``metric`` from <run_dir>/val.jsonl (a later record of the same step wins)."""
    path = Path(run_dir) / "val.jsonl"
    if not path.is_file():
        return {}
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if metric in rec:
                out[int(rec["step"])] = float(rec[metric])
    return out


def export_steps(run_dir: Path | str) -> dict[int, Path]:
    """step -> export path of <run_dir>/exports/step-N.safetensors."""
    folder = Path(run_dir) / "exports"
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _EXPORT.match(p.name))}


def pick_sft_run(
    run_dir: Path | str,
    *,
    min_step: int = DEFAULT_MIN_STEP,
    rel_tol: float = DEFAULT_REL_TOL,
    metric: str = DEFAULT_METRIC,
) -> SftPick:
    """The pick over an SFT run folder; ``path`` is the chosen export."""
    exports = export_steps(run_dir)
    pick = pick_sft(read_val_scores(run_dir, metric), min_step=min_step, rel_tol=rel_tol, available=exports)
    return replace(pick, path=exports[pick.step])
