"""The stage table: every training stage of the chain, named once.

Everything that knows a stage by name is derived from ``STAGES``: the run config's typed sections
(``Gc25dConfig.<name>``, gc25d_core.config), the presets (``configs/<name>/<preset>.yaml``,
gc25d_core.train.presets), the loop's dispatch (``train.loop.run_stage``), the one torchrun entry
point (``python -m gc25d_core.jobs.train --stage <name>``), and on the Dagster side the stage assets,
the chain job that selects them by the graph, eval's sources and deploy's choices
(docs/architecture.md, "Adding a stage").

This module is light on purpose (pydantic only, no torch): the run class is named by its import path
and imported only when the stage runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gc25d_core.names import InvalidNameError, check_name
from gc25d_core.schema import ConfigError
from gc25d_core.stage_config import SftConfig, Stage1Config, Stage2Config, Stage3Config, StageConfig

Export = Literal["export", "ema"]
# the hand-off files (gc25d_core.handoff's FINAL and TEACHER, which tests/test_stage_table.py
# checks; not imported from there: handoff imports the run config, which is built from this table)
HandoffFile = Literal["final.json", "teacher.json"]
FINAL: HandoffFile = "final.json"
TEACHER: HandoffFile = "teacher.json"


@dataclass(frozen=True)
class Upstream:
    """Where a stage's weights come from: the hand-off file of an earlier stage (its ``handoff``)
    in that stage's run folder for the same snapshot, and which of its exports."""

    stage: str
    export: Export = "export"


@dataclass(frozen=True)
class Stage:
    """One training stage.

    ``section``: its typed section of the run config (a ``StageConfig`` subclass; presets in
    configs/<name>/). ``run``: its ``StageRun`` subclass as ``"module:Class"``. ``handoff``: the file
    later stages and eval read its result from: ``final.json`` (the loop writes it at max_steps) or
    ``teacher.json`` (the SFT: written by the §10 pick, the ``sft_teacher`` asset, into its run
    folder). ``init_from`` sets the section's ``model`` from an upstream hand-off, ``real_from`` its
    ``real`` model (stage 3's real score and critic init); a stage without ``init_from`` starts from
    the training cache. ``feeds_deploy``: the deploy export may take its final.json. ``evaluated``:
    eval reads its hand-off. ``kinds``: the Dagster asset's kind tags."""

    name: str
    section: type[StageConfig]
    run: str
    description: str
    handoff: HandoffFile = FINAL
    init_from: Upstream | None = None
    real_from: Upstream | None = None
    feeds_deploy: bool = False
    evaluated: bool = True
    kinds: tuple[str, ...] = ("torch", "deepspeed")

    @property
    def preset_folder(self) -> str:
        """Its presets' folder under configs/."""
        return self.name

    def run_class(self) -> Any:
        """The ``StageRun`` subclass (imports the stage's math, and with it torch)."""
        module, _, cls = self.run.partition(":")
        return getattr(importlib.import_module(module), cls)


STAGES: tuple[Stage, ...] = (
    Stage(
        "sft",
        SftConfig,
        "gc25d_core.train.sft:SftRun",
        "SPEC §7 SFT: the bidirectional teacher on this snapshot; progress streams to the run log. "
        "Its metadata shows the validation curves, the cond / uncond gap and a validation sample "
        "(ground truth | prediction at t=500 | ids) as a video; sft_teacher picks it (teacher.json).",
        handoff=TEACHER,
    ),
    Stage(
        "stage1_tf",
        Stage1Config,
        "gc25d_core.train.stage1_tf:Stage1Run",
        "SPEC §8 stage 1: the causal student by teacher forcing from the picked teacher "
        "(teacher.json); its final.json is stage 2's init.",
        init_from=Upstream("sft"),
        feeds_deploy=True,
    ),
    Stage(
        "stage2_cd",
        Stage2Config,
        "gc25d_core.train.stage2_cd:Stage2Run",
        "SPEC §8 stage 2: causal consistency distillation onto the 4-step deploy axis with an EMA "
        "target, from stage 1's final export; its EMA exports are the deploy candidate and stage 3's init.",
        init_from=Upstream("stage1_tf"),
        feeds_deploy=True,
    ),
    Stage(
        "stage3_dmd",
        Stage3Config,
        "gc25d_core.train.stage3_dmd:Stage3Run",
        "SPEC §8 stage 3: DMD with self-rollout from stage 2's EMA, the SFT teacher as real score and "
        "critic init, FSDP; its EMA exports are what deploy takes.",
        init_from=Upstream("stage2_cd", "ema"),
        real_from=Upstream("sft"),
        feeds_deploy=True,
        kinds=("torch", "fsdp"),
    ),
)


def check_table(stages: tuple[Stage, ...]) -> None:
    """Names are bare and unique; an upstream is an earlier stage; hand-off files are known."""
    seen: set[str] = set()
    for s in stages:
        try:
            check_name(s.name, "stage name")
        except InvalidNameError as e:
            raise ValueError(str(e)) from None
        if s.name in seen:
            raise ValueError(f"stage {s.name!r} is in the table twice")
        if not (isinstance(s.section, type) and issubclass(s.section, StageConfig)):
            raise ValueError(f"stage {s.name}: section {s.section!r} is not a StageConfig subclass")
        if s.run.count(":") != 1:
            raise ValueError(f"stage {s.name}: run={s.run!r} is not 'module:Class'")
        if s.handoff not in get_args(HandoffFile):
            raise ValueError(f"stage {s.name}: handoff={s.handoff!r} ({FINAL} | {TEACHER})")
        for what, up in (("init_from", s.init_from), ("real_from", s.real_from)):
            if up is not None and up.stage not in seen:
                raise ValueError(
                    f"stage {s.name}: {what}={up.stage!r} is not a stage before it in the table "
                    f"(before it: {sorted(seen)})"
                )
        seen.add(s.name)


check_table(STAGES)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def stage(name: str) -> Stage:
    """The table entry ``name``; an error naming the known stages otherwise."""
    if name not in BY_NAME:
        raise ConfigError(f"unknown stage {name!r} (the stages of gc25d_core.stages: {sorted(BY_NAME)})")
    return BY_NAME[name]
