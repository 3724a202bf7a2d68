"""The config models' base and their error type (kept apart from ``config`` so that stage sections in
``stage_config`` and the run config in ``config`` can both build on them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """Base: unknown keys are errors; instances are immutable and hashable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A preset or override failed validation; the message names the file and the field."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)
