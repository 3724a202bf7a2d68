"""Stage presets: ``configs/<stage>/<name>.yaml`` merged into the run config's typed stage field
(the stages, their sections and preset folders: gc25d_core.stages)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gc25d_core.config import CONFIGS_DIR, Gc25dConfig, deep_merge, read_yaml
from gc25d_core.names import InvalidNameError, path_under
from gc25d_core.schema import ConfigError, format_validation_error
from gc25d_core.stage_config import StageConfig
from gc25d_core.stages import BY_NAME

# the run config's field of each stage and its section type
STAGES: dict[str, type[StageConfig]] = {name: s.section for name, s in BY_NAME.items()}


def stage_section(stage: str, name: str) -> dict[str, Any]:
    """configs/<stage>/<name>.yaml as a dict; ``name`` must be a bare name (gc25d_core.names) whose
    file lies inside configs/<stage>/."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r} (known: {sorted(STAGES)})")
    try:
        folder = BY_NAME[stage].preset_folder
        path = path_under(CONFIGS_DIR / folder, name, f"{stage}_preset", suffix=".yaml")
    except InvalidNameError as e:
        raise ConfigError(str(e)) from None
    return read_yaml(path)


def with_stage(
    cfg: Gc25dConfig, stage: str, section: str | dict[str, Any], overrides: dict[str, Any] | None = None
) -> Gc25dConfig:
    """``cfg`` with its ``stage`` field = the named preset (or a dict), deep-merged with overrides."""
    data = stage_section(stage, section) if isinstance(section, str) else dict(section)
    if overrides:
        data = deep_merge(data, overrides)
    where = f"configs/{BY_NAME[stage].preset_folder}/{section}.yaml" if isinstance(section, str) else stage
    try:
        typed = STAGES[stage].model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, where)) from None
    return cfg.model_copy(update={stage: typed})


def stage_config(cfg: Gc25dConfig, stage: str) -> Any:
    """The run config's section of ``stage``; an error naming it when the config has none."""
    section = getattr(cfg, stage, None)
    if section is None:
        raise ConfigError(
            f"the run config has no {stage!r} section (configs/{stage}/<preset>.yaml, with_stage)"
        )
    return section
