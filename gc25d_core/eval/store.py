"""Kept evaluation results: one row per (export, sweep), keyed by what its numbers depend on, so an
eval with nothing changed recomputes nothing and a changed export recomputes only its rows.

A row's key is the SHA256 of: the export's SHA256 (not its path, label or step: a copy of the same
weights anywhere gives the same numbers), the sweep's definition (its settings; for the dataset
sweeps also the snapshot and the cases; for the live sweeps the world and the scripts), the
preset's fields that shape the numbers (``context_doc``: vocab, geometry, timeline, text, the VAE
and its weights' SHA256, the device) and the code's version (``code_version``: the bytes of the
eval, model, deploy and code-world sources, so an edit there recomputes; a comment edit does too,
which errs on the safe side).

Rows live in ``<runs_root>/eval_results/<key>.json`` (written atomically), shared by every
snapshot's eval run folder: the live sweeps do not read the snapshot, so a new snapshot with the
same exports keeps their rows.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import Gc25dConfig
from gc25d_core.hashing import file_identities

if TYPE_CHECKING:
    from gc25d_core.eval.spec import EvalOutput

STORE_DIR = "eval_results"
_CORE = Path(__file__).resolve().parents[1]
# the sources a result's numbers come from (relative to gc25d_core/)
CODE_SOURCES = (
    "eval",
    "models",
    "deploy",
    "codeworld",
    "capsules.py",
    "text.py",
    "vocab.py",
    "geometry.py",
    "flow.py",
)


def code_version(root: Path = _CORE, sources: tuple[str, ...] = CODE_SOURCES) -> str:
    h = hashlib.sha256()
    for name in sources:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def context_doc(cfg: Gc25dConfig, uses_vae: bool = True) -> dict[str, Any]:
    """The preset's fields a result depends on (the training sections do not: the export is hashed);
    the VAE's weights where the eval runs it (decodes, live sessions)."""
    from gc25d_core.models.vae_fit import resolve_vae_file

    found = resolve_vae_file(cfg) if uses_vae else None
    doc = cfg.model_dump(
        mode="json", include={"vocab", "seed", "device", "geometry", "timeline", "text", "vae"}
    )
    doc["vae_sha256"] = None if found is None else found[1]
    return doc


def job_key(cfg: Gc25dConfig, input_text: str) -> str:
    """What an eval job's files depend on besides the files it reads (``used_files``): its
    eval_input.json as written, the code's version and the preset's fields of ``context_doc``."""
    fields = cfg.model_dump(
        mode="json", include={"vocab", "seed", "device", "geometry", "timeline", "text", "vae"}
    )
    doc = {"input": input_text, "code": code_version(), "context": fields}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def used_files(cfg: Gc25dConfig, uses_vae: bool) -> list[Path]:
    """The weights file an eval job reads besides its exports (named with their SHA256 in its input)."""
    from gc25d_core.models.vae_fit import resolve_vae_file

    found = resolve_vae_file(cfg) if uses_vae else None
    return [] if found is None else [found[0]]


def finished_eval(cfg: Gc25dConfig, run_dir: Path) -> EvalOutput | None:
    """The ``EvalOutput`` of a finished eval job in ``run_dir`` with this very key, the files it read
    unchanged and its report files all there: a launch would compute nothing. None: launch it (the
    job keeps the rows it can)."""
    from gc25d_core.eval.spec import INPUT_FILE, OUTPUT_FILE, EvalOutput, read_model
    from gc25d_core.schema import ConfigError

    run_dir = Path(run_dir)
    try:
        out = read_model(run_dir, OUTPUT_FILE, EvalOutput)
        key = job_key(cfg, (run_dir / INPUT_FILE).read_text())
    except (ConfigError, OSError):
        return None
    reports = ["table.md", *(f"{label}/metrics.json" for label in out.exports), *out.plots]
    if out.job_key != key or not all((run_dir / f).is_file() for f in reports):
        return None
    try:
        same = file_identities(out.depends_on) == out.depends_on
    except OSError:
        return None
    return out if same else None


def row_key(code: str, export_sha256: str, sweep_doc: dict[str, Any], context: dict[str, Any]) -> str:
    doc = {"code": code, "export": export_sha256, "sweep": sweep_doc, "context": context}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON")


class ResultStore:
    def __init__(self, folder: Path | str):
        self.folder = Path(folder)

    @classmethod
    def of(cls, cfg: Gc25dConfig) -> ResultStore:
        return cls(Path(cfg.paths.runs_root) / STORE_DIR)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def put(self, key: str, row: dict[str, Any]) -> None:
        """``row``: {"sampler": …, "sweep": the sweep's result, "strip": PNG bytes or None,
        "numerics": the computing process's record or None}; NaN kept as NaN so that a kept row
        gives the same report files as a fresh one."""
        strip = row.get("strip")
        doc = {
            "key": key,
            "sampler": row["sampler"],
            "sweep": row["sweep"],
            "strip": None if strip is None else base64.b64encode(strip).decode(),
            # the box and kernel paths its digits came from (gc25d_core.numerics): not part of the
            # key, so a shared store keeps a row computed elsewhere, and the report says so
            "numerics": row.get("numerics"),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path(key), json.dumps(doc, allow_nan=True, default=_plain))

    def get(self, key: str) -> dict[str, Any] | None:
        """The row kept under ``key``, or None (none, another key, unreadable: compute it again)."""
        try:
            doc = json.loads(self.path(key).read_text())
            if doc.get("key") != key:
                return None
            strip = doc["strip"]
            return {
                "sampler": doc["sampler"],
                "sweep": doc["sweep"],
                "strip": None if strip is None else base64.b64decode(strip),
                "numerics": doc.get("numerics"),  # None: kept before rows recorded it
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
