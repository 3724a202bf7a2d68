"""Which export ``make play`` serves: the newest causal export a run of the embedded default left.

Stages hand their exports on in ``final.json`` files (gc25d_core.handoff) in their run
folders ``<runs_root>/<asset>/<partition>/``. Preference: the deploy export, then stage 3's EMA,
stage 2's EMA, stage 1's export (the newest partition of the first stage that has one); the hand-off's
SHA256 is then checked at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gc25d_core.handoff import FINAL, read_handoff

SOURCES = (("deploy_export", "export"), ("stage3_dmd", "ema"), ("stage2_cd", "ema"), ("stage1_tf", "export"))


class NoExportError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class Located:
    path: Path
    sha256: str
    source: str  # e.g. "stage3_dmd/v000001 (ema)"


def newest_causal_export(runs_root: Path | str) -> Located:
    """The export of the newest hand-off of the first source that has one; its name resolved inside
    ``runs_root`` (a copied tree reads its own exports, never those of the tree it came from)."""
    root = Path(runs_root)
    for stage, which in SOURCES:
        files = sorted((root / stage).glob(f"*/{FINAL}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for f in files:
            h = read_handoff(f, root)
            pick = which if (which != "ema" or h.ema_export is not None) else "export"
            path, sha = h.pick(pick)
            return Located(path, sha, f"{stage}/{f.parent.name} ({pick})")
    raise NoExportError(
        f"no causal export under {root}: looked for {', '.join(f'{s}/*/{FINAL}' for s, _ in SOURCES)}. "
        "Train the chain first (make run, then stage1_tf at least), or pass --export PATH"
    )
