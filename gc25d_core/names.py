"""Names that become paths: one strict check, and one join that cannot leave its root.

Every string from a user, a config, a partition key or a manifest that names a file or folder
(presets, stages, partitions, workers, ids) goes through ``check_name``; where it is joined under a
root, ``path_under`` also resolves the result (symlinks included) and refuses anything outside.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_NAME_LEN = 128
# ASCII only (``\w`` would admit Unicode look-alikes); "." may not lead, so no hidden files, no "..".
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class InvalidNameError(ValueError):
    """A name is not a safe single path component, or its path leaves its root; names field and value."""


def check_name(value: object, field: str, *, max_len: int = MAX_NAME_LEN) -> str:
    """``value`` if it is one safe path component: 1..max_len of [A-Za-z0-9._-], no leading '.',
    no '..', no separators. Raises InvalidNameError naming ``field`` and the value."""
    if not isinstance(value, str):
        raise InvalidNameError(f"{field}={value!r}: must be a str, got {type(value).__name__}")
    # fullmatch: a trailing newline would slip through re.match with "$"
    if not (0 < len(value) <= max_len) or _NAME.fullmatch(value) is None or ".." in value:
        raise InvalidNameError(
            f"{field}={value!r}: must be 1-{max_len} characters of letters, digits, '_', '-' and '.' "
            "(not leading), without '..' or path separators"
        )
    return value


def path_under(root: Path | str, name: str, field: str, *, suffix: str = "") -> Path:
    """``root / (name + suffix)`` for a checked ``name`` whose resolved path (symlinks followed)
    stays inside the resolved ``root``; the returned path keeps ``root`` as given."""
    check_name(name, field)
    path = Path(root) / f"{name}{suffix}"
    resolved, resolved_root = path.resolve(), Path(root).resolve()
    if resolved == resolved_root or not resolved.is_relative_to(resolved_root):
        raise InvalidNameError(f"{field}={name!r}: {path} resolves to {resolved}, outside {resolved_root}")
    return path
