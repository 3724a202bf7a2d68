"""Hand-offs between stages: a small JSON file in the producing run folder that names one export.

The SFT pick writes ``teacher.json`` (the picked step's export), every stage writes ``final.json`` at
its last step (its final export, and its EMA export where it keeps one). The next stage's config
points at that file (``model.init: handoff``, ``model.handoff``); the export's SHA256 is recorded
here and checked when the export is read, so a later overwrite cannot slip in unnoticed.

A hand-off names its exports relative to the runs root (``paths.runs_root``), e.g.
``sft/v000001/exports/step-000020.safetensors``: a runs root moved or copied elsewhere (with its
data) keeps working, and a copy never reads the tree it was copied from. A reader resolves the
names against the runs root it is configured with and refuses any that lands outside it (``..``,
an absolute path elsewhere, a symbolic link leading out). Hand-offs written before held absolute
paths: those are still read when they lie inside the reader's runs root (the same file a relative
name would give, its hash checked as ever), so finished runs need not be redone; one elsewhere
(another checkout's tree) is refused with the advice to re-run the producing step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, ValidationError

from gc25d_core.atomic import atomic_write_text
from gc25d_core.checkpoint import step_name
from gc25d_core.config import Sha256Hex
from gc25d_core.hashing import sha256_file
from gc25d_core.schema import ConfigError, Strict, format_validation_error

FINAL = "final.json"
TEACHER = "teacher.json"


class Handoff(Strict):
    """A hand-off. In the file ``export`` / ``ema_export`` are relative to the runs root;
    ``read_handoff`` returns them resolved (absolute, checked to lie inside it)."""

    stage: str
    step: int = Field(ge=0)
    export: Path
    sha256: Sha256Hex
    ema_export: Path | None = None
    ema_sha256: Sha256Hex | None = None

    def pick(self, which: str) -> tuple[Path, str]:
        """(path, sha256) of the ``export`` or the ``ema`` export."""
        if which == "ema":
            if self.ema_export is None or self.ema_sha256 is None:
                raise ConfigError(f"the {self.stage} hand-off (step {self.step}) has no EMA export")
            return self.ema_export, self.ema_sha256
        return self.export, self.sha256


def field_of(which: str) -> str:
    """The hand-off file's field that ``pick(which)`` reads."""
    return "ema_export" if which == "ema" else "export"


def runs_relative(path: Path | str, runs_root: Path | str) -> str:
    """``path`` for a record: relative to the runs root where it lies inside it (the record stays
    true when the runs root moves), else as given."""
    root, resolved = Path(runs_root).resolve(), Path(path).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def _inside(path: Path, runs_root: Path | str, what: str) -> Path:
    """``path`` relative to the runs root it must lie in (symbolic links followed)."""
    root = Path(runs_root).resolve()
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root):
        raise ConfigError(
            f"{what} {path} is outside the runs root {root} (paths.runs_root): a hand-off names "
            "exports inside the runs root only"
        )
    return resolved.relative_to(root)


def handoff_of(
    stage: str, step: int, export: Path, ema_export: Path | None = None, *, runs_root: Path | str
) -> Handoff:
    """The hand-off of ``export`` (and ``ema_export``), both inside ``runs_root``, named relative to it."""
    return Handoff(
        stage=stage,
        step=step,
        export=_inside(export, runs_root, f"the {stage} export"),
        sha256=sha256_file(export),
        ema_export=None if ema_export is None else _inside(ema_export, runs_root, f"the {stage} EMA export"),
        ema_sha256=None if ema_export is None else sha256_file(ema_export),
    )


def write_handoff_file(path: Path, handoff: Handoff) -> Path:
    for field in ("export", "ema_export"):
        p = getattr(handoff, field)
        if p is not None and (p.is_absolute() or ".." in p.parts):
            raise ValueError(f"hand-off {path}: {field}={str(p)!r} must be relative to the runs root")
    atomic_write_text(path, handoff.model_dump_json(indent=1))
    return path


def write_handoff(
    run_dir: Path,
    stage: str,
    step: int,
    export_dir: Path,
    runs_root: Path | str,
    warn: Callable[[str], None] = lambda _: None,
) -> Path | None:
    """``final.json`` for the last step's export (and ``ema/`` export), if the step exported. A run
    folder outside ``runs_root`` (a hand launch with another --run-dir) gets none, with a ``warn``:
    no reader configured with that runs root could take it."""
    export = export_dir / f"{step_name(step)}.safetensors"
    if not export.is_file():
        return None
    if not Path(run_dir).resolve().is_relative_to(Path(runs_root).resolve()):
        warn(
            f"no {FINAL} written: the run folder {run_dir} is outside paths.runs_root={runs_root}, and a "
            "hand-off names its exports relative to the runs root (launch with the run folder under it)"
        )
        return None
    ema = export_dir / "ema" / export.name
    handoff = handoff_of(stage, step, export, ema if ema.is_file() else None, runs_root=runs_root)
    return write_handoff_file(run_dir / FINAL, handoff)


def _resolve(path: Path, field: str, name: Path, runs_root: Path) -> Path:
    """The export ``name`` (the hand-off ``path``'s ``field``) inside ``runs_root``, or a ConfigError."""
    root = runs_root.resolve()
    where = f"hand-off {path}: {field}={str(name)!r}"
    if ".." in name.parts:
        raise ConfigError(f"{where} contains '..': exports are named inside the runs root {root}")
    resolved = (root / name).resolve()  # an absolute name stays as it is (the older format)
    if not resolved.is_relative_to(root):
        why = (
            "an absolute path outside it (written by an older version, or in another tree this one was "
            "copied from): re-run the producing stage's last step (or the SFT pick) to rewrite the file"
            if name.is_absolute()
            else "a symbolic link leads out of it"
        )
        raise ConfigError(
            f"{where} resolves to {resolved}, outside the runs root {root} (paths.runs_root): {why}"
        )
    if not resolved.is_file():
        raise ConfigError(f"{where}: the export {resolved} does not exist")
    return resolved


def read_handoff(path: Path, runs_root: Path | str) -> Handoff:
    """A hand-off file, validated; its exports resolved inside ``runs_root`` and present (their hash
    is checked at load)."""
    path = Path(path)
    try:
        handoff = Handoff.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise ConfigError(
            f"hand-off file {path} does not exist (has the producing stage finished?)"
        ) from None
    except ValueError as e:
        if isinstance(e, ValidationError):
            raise ConfigError(format_validation_error(e, str(path))) from None
        raise ConfigError(f"{path}: not a hand-off JSON file ({e})") from None
    if (handoff.ema_export is None) != (handoff.ema_sha256 is None):
        raise ConfigError(f"hand-off {path}: ema_export and ema_sha256 go together")
    root = Path(runs_root)
    update = {"export": _resolve(path, "export", handoff.export, root)}
    if handoff.ema_export is not None:
        update["ema_export"] = _resolve(path, "ema_export", handoff.ema_export, root)
    return handoff.model_copy(update=update)
