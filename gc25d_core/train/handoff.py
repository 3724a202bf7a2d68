"""Hand-offs between stages: a small JSON file in the producing run folder that names one export.

The SFT pick writes ``teacher.json`` (the picked step's export), every stage writes ``final.json`` at
its last step (its final export, and its EMA export where it keeps one). The next stage's config
points at that file (``model.init: handoff``, ``model.handoff``); the export's SHA256 is recorded
here and checked when the export is read, so a later overwrite cannot slip in unnoticed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from gc25d_core.atomic import atomic_write_text
from gc25d_core.checkpoint import step_name
from gc25d_core.hashing import sha256_file
from gc25d_core.schema import ConfigError, Strict, format_validation_error

FINAL = "final.json"
TEACHER = "teacher.json"


class Handoff(Strict):
    stage: str
    step: int
    export: Path  # absolute
    sha256: str
    ema_export: Path | None = None
    ema_sha256: str | None = None

    def pick(self, which: str) -> tuple[Path, str]:
        """(path, sha256) of the ``export`` or the ``ema`` export."""
        if which == "ema":
            if self.ema_export is None or self.ema_sha256 is None:
                raise ConfigError(f"the {self.stage} hand-off (step {self.step}) has no EMA export")
            return self.ema_export, self.ema_sha256
        return self.export, self.sha256


def handoff_of(stage: str, step: int, export: Path, ema_export: Path | None = None) -> Handoff:
    export = export.resolve()
    ema = ema_export.resolve() if ema_export is not None else None
    return Handoff(
        stage=stage,
        step=step,
        export=export,
        sha256=sha256_file(export),
        ema_export=ema,
        ema_sha256=sha256_file(ema) if ema is not None else None,
    )


def write_handoff_file(path: Path, handoff: Handoff) -> Path:
    atomic_write_text(path, handoff.model_dump_json(indent=1))
    return path


def write_handoff(run_dir: Path, stage: str, step: int, export_dir: Path) -> Path | None:
    """``final.json`` for the last step's export (and ``ema/`` export), if the step exported."""
    export = export_dir / f"{step_name(step)}.safetensors"
    if not export.is_file():
        return None
    ema = export_dir / "ema" / export.name
    return write_handoff_file(
        run_dir / FINAL, handoff_of(stage, step, export, ema if ema.is_file() else None)
    )


def read_handoff(path: Path) -> Handoff:
    """A hand-off file, validated; the export it names must exist (its hash is checked at load)."""
    try:
        handoff = Handoff.model_validate(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise ConfigError(
            f"hand-off file {path} does not exist (has the producing stage finished?)"
        ) from None
    except ValueError as e:
        if isinstance(e, ValidationError):
            raise ConfigError(format_validation_error(e, str(path))) from None
        raise ConfigError(f"{path}: not a hand-off JSON file ({e})") from None
    for p in (handoff.export, handoff.ema_export):
        if p is not None and not p.is_file():
            raise ConfigError(f"{path}: export {p} does not exist")
    return handoff
