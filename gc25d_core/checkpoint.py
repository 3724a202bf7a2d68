"""Checkpoint folders: ``<root>/step-000100/`` saved atomically (temp folder + rename), and the
verified torch state files inside them.

Resume is the default path: ``latest()`` is the newest complete step folder (a folder is complete
once renamed into place; temp folders start with ``.tmp-``). ``keep`` rotates old ones away. A step
folder found damaged is set aside as ``damaged-step-N`` (``set_aside``): out of the rotation, so
saves never count it against the good ones, and kept for whoever wants to see what went wrong.

State files are deserialised the way the training cache's samples are: the bytes are read once,
their SHA256 must equal the one recorded at save (``sha256.json`` in the step folder), and only those
bytes go to ``torch.load(weights_only=True)``, whose unpickler builds tensors and plain containers
but calls nothing else. A file someone planted or changed in a state folder is refused by its hash;
one planted together with a forged record is still only data to the weights-only unpickler.
During a collective save every rank records the files it wrote (``write_digest_part``) and rank 0
merges the parts (``seal_digests``) before the folder is committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gc25d_core.atomic import TMP_PREFIX, atomic_write_text, fsync_dir, make_tmp_dir
from gc25d_core.hashing import sha256_file

_STEP = re.compile(r"^step-(\d{6,})$")
DAMAGED_PREFIX = "damaged-"
DIGESTS = "sha256.json"
_DIGEST_PART = re.compile(r"^sha256-rank(\d+)\.json$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # no leading dot: no "..", no temp names


class StateFileError(ValueError):
    """A state file or its digest record that must not be (or could not be) deserialised."""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


class CheckpointDir:
    def __init__(self, root: Path | str, keep: int | None = None):
        self.root = Path(root)
        self.keep = keep

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP.match(p.name)
            if m and p.is_dir():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def save(self, step: int, write: Callable[[Path], object]) -> Path:
        """``write(tmp_dir)`` fills a temp folder that then becomes ``step-N`` atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(step)
        tmp = make_tmp_dir(self.root, final.name)
        try:
            write(tmp)
            return self.commit(tmp, step)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def shared_tmp(self, step: int) -> Path:
        """A temp folder name every rank of a collective save can compute (filled, then ``commit``)."""
        return self.root / f"{TMP_PREFIX}{step_name(step)}"

    def commit(self, tmp: Path, step: int) -> Path:
        """``tmp`` (a filled temp folder in ``root``) becomes ``step-N``; old ones rotate away."""
        final = self.path(step)
        if final.exists():  # a re-run of the same step: replace the older save
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._rotate()
        return final

    def aside_name(self, step: int) -> Path:
        """Where ``set_aside`` would put ``step-N`` now: ``damaged-step-N``, or ``-2``, ``-3``, ... when taken."""
        base = self.root / f"{DAMAGED_PREFIX}{step_name(step)}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return path

    def set_aside(self, step: int, dest: Path) -> Path:
        """Rename the damaged ``step-N`` to ``dest`` (an ``aside_name``): no longer a step, kept as it is."""
        if dest.exists():  # a rename onto an empty folder would replace it
            raise FileExistsError(f"{dest}: exists, not setting {self.path(step)} aside onto it")
        os.rename(self.path(step), dest)
        fsync_dir(self.root)
        return dest

    def clean_tmp(self) -> None:
        """Remove temp folders of saves that were killed."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(TMP_PREFIX):
                    shutil.rmtree(p, ignore_errors=True)

    def save_json(self, step: int, state: dict[str, Any], name: str = "state.json") -> Path:
        return self.save(step, lambda d: (d / name).write_text(json.dumps(state, sort_keys=True)))

    def load_json(self, step: int, name: str = "state.json") -> dict[str, Any]:
        path = self.path(step) / name
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: unreadable checkpoint state ({e})") from e

    def _rotate(self) -> None:
        if self.keep is None:
            return
        for step in self.steps()[: -self.keep]:
            shutil.rmtree(self.path(step), ignore_errors=True)


# ============================================================================== verified state files


def check_state_name(name: str, where: str) -> str:
    """``name`` (from a digest record) as a relative path inside the step folder: '/'-separated
    parts of letters, digits, '_', '.', '-', none empty or starting with a dot."""
    parts = name.split("/")
    if not all(_NAME_PART.match(p) for p in parts):
        raise StateFileError(f"{where}: {name!r} is not a relative file name inside the step folder")
    return name


def save_torch(obj: Any, path: Path, *, zipfile: bool = True) -> str:
    """``torch.save`` to ``path`` (inside a temp step folder, so not atomic by itself); its SHA256."""
    import torch

    torch.save(obj, path, _use_new_zipfile_serialization=zipfile)
    return sha256_file(path)


@contextlib.contextmanager
def _allowlisted(classes: Sequence[type]) -> Iterator[None]:
    import torch

    if not classes:
        yield
        return
    with torch.serialization.safe_globals(list(classes)):
        yield


def load_torch(
    path: Path,
    sha256: str | None,
    *,
    map_location: Any = None,
    allowed: Sequence[type] = (),
) -> Any:
    """``torch.load(weights_only=True)`` of ``path``'s bytes, once they match ``sha256`` (None: no
    record to check against, the weights-only unpickler alone). ``allowed``: the exact extra classes
    the weights-only unpickler may build (by ``__new__`` + state, never by calling them), for this
    load only. Every failure is a StateFileError naming the file.

    The file is read whole, so it costs its size in host memory beside the loaded tensors for the
    duration of the load: the price of unpickling exactly the bytes that were hashed."""
    import torch

    try:
        data = path.read_bytes()  # one read: a file swapped after the hash check cannot reach torch.load
    except OSError as e:
        raise StateFileError(f"{path}: unreadable state file ({e})") from e
    if sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise StateFileError(
                f"{path}: SHA256 {actual} differs from the recorded {sha256}; the file changed after it "
                "was saved and is not deserialised"
            )
    try:
        with _allowlisted(allowed):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise StateFileError(
            f"{path}: refused by torch.load(weights_only=True), it holds more than tensors and plain "
            f"data: {_unpickler_reason(e)}"
        ) from e
    except Exception as e:  # torch raises several types for damaged archives
        raise StateFileError(f"{path}: unreadable state file ({type(e).__name__}: {e})") from e


_ADVICE = ("Weights only load failed", "Check the documentation", "(1)", "(2)")


def _unpickler_reason(e: Exception) -> str:
    """The line of torch's weights-only error that names what was refused (it wraps it in advice)."""
    lines = [line.strip() for line in str(e).splitlines()]
    reasons = [line for line in lines if line and not line.startswith(_ADVICE)]
    return reasons[0] if reasons else str(e)


def write_digest_part(folder: Path, rank: int, digests: Mapping[str, str]) -> Path:
    """One rank's record of the files it wrote into ``folder`` (name relative to it -> SHA256)."""
    path = folder / f"sha256-rank{rank}.json"
    for name, digest in digests.items():
        _check_digest_entry(name, digest, str(path))
    return atomic_write_text(path, json.dumps(dict(digests), sort_keys=True, indent=1))


def seal_digests(folder: Path) -> dict[str, str]:
    """Merge every rank's part into ``folder/sha256.json`` (after all ranks wrote; before commit)."""
    merged: dict[str, str] = {}
    parts = sorted(p for p in folder.iterdir() if _DIGEST_PART.match(p.name))
    for part in parts:
        for name, digest in _read_digest_file(part).items():
            if merged.setdefault(name, digest) != digest:
                raise StateFileError(f"{part}: {name!r} recorded with two different SHA256 by two ranks")
    atomic_write_text(folder / DIGESTS, json.dumps(merged, sort_keys=True, indent=1))
    for part in parts:
        part.unlink()
    return merged


def read_digests(folder: Path) -> dict[str, str]:
    """``folder/sha256.json``, validated: names inside the folder, SHA256 as 64 lower-case hex digits."""
    path = folder / DIGESTS
    if not path.is_file():
        raise StateFileError(
            f"{path}: missing; without the SHA256 record of its files this state folder is not loaded"
        )
    return _read_digest_file(path)


def check_recorded(folder: Path, digests: Mapping[str, str], names: Sequence[str]) -> str | None:
    """Why one of ``names`` in ``folder`` does not match its recorded SHA256 (missing, unreadable,
    changed); None when all match. Reads every byte: the check a resume makes before it trusts a slot."""
    for name in names:
        path = folder / check_state_name(name, str(folder / DIGESTS))
        try:
            actual = sha256_file(path)
        except OSError as e:
            return f"{path}: unreadable state file ({e})"
        if actual != digests[name]:
            return f"{path}: SHA256 {actual} differs from the recorded {digests[name]}"
    return None


def recorded_digest(digests: Mapping[str, str], folder: Path, name: str) -> str:
    """The recorded SHA256 of ``folder/name``; a file the record does not list is refused."""
    if name not in digests:
        raise StateFileError(f"{folder / name}: not listed in {folder / DIGESTS}, not deserialised")
    return digests[name]


def _read_digest_file(path: Path) -> dict[str, str]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StateFileError(f"{path}: unreadable digest record ({e})") from e
    if not isinstance(record, dict):
        raise StateFileError(f"{path}: a digest record is an object of file name -> SHA256")
    for name, digest in record.items():
        _check_digest_entry(name, digest, str(path))
    return record


def _check_digest_entry(name: Any, digest: Any, where: str) -> None:
    if not isinstance(name, str):
        raise StateFileError(f"{where}: file name {name!r} is not a string")
    check_state_name(name, where)
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise StateFileError(f"{where}: {name}: {digest!r} is not a SHA256 (64 lower-case hex digits)")
