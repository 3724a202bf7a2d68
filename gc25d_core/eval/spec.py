"""What an evaluation is asked to do and what it did, as the files its launcher and its job share.

The Dagster step that launches ``python -m gc25d_core.jobs.eval`` writes ``eval_input.json`` into
the run folder (the snapshot, the sweeps' settings, the exports that exist); the job writes its
reports there and ``eval_output.json`` (what was evaluated, what was left out, the plots), which
the step reads to describe the materialization. This module imports no model code:
the step process reads hand-off files and these two files only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator

from gc25d_core.atomic import atomic_write_text
from gc25d_core.eval.metrics import PSNR_CAP_DB
from gc25d_core.eval.sweeps import SWEEP_CELLS
from gc25d_core.names import check_name
from gc25d_core.schema import ConfigError, Strict, format_validation_error

INPUT_FILE = "eval_input.json"
OUTPUT_FILE = "eval_output.json"


class EvalConfig(Strict):
    """What an evaluation runs; the sweeps' definitions are fixed (gc25d_core.eval.sweeps)."""

    clip28_clips: int = Field(default=4, ge=0, description="has_ext val clips of clip28 (0: skip the sweep)")
    chain241_chains: int = Field(default=2, ge=0, description="val runs of chain241 (0: skip the sweep)")
    clip28_cells: int = Field(default=SWEEP_CELLS["clip28"], ge=2)
    chain241_cells: int = Field(default=SWEEP_CELLS["chain241"], ge=2)
    teacher_steps: int = Field(default=40, ge=1, description="Euler steps of the bidirectional teacher")
    teacher_window: int = Field(default=21, ge=2, description="cells per teacher window (its trained length)")
    teacher_context_cells: int = Field(
        default=1, ge=1, description="clean cells a later teacher window starts from"
    )
    seed: int = 0
    psnr_cap_db: float = Field(default=PSNR_CAP_DB, gt=0)
    decode: bool = Field(default=True, description="decode rollouts for the pixel metrics (needs the VAE)")
    live_sweeps: list[str] = Field(
        default_factory=list, description="live sessions scored against the code world (eval.live)"
    )
    live_cells: int | None = Field(
        default=None, ge=2, description="shorten the live sweeps to this many cells (tests)"
    )
    live_ceiling: bool = Field(
        default=False,
        description="score the truth through the VAE beside the exports (the session's frames had its "
        "latents been perfect): one more decode of each live session on each rank that scores one",
    )

    @field_validator("live_sweeps")
    @classmethod
    def _known_live(cls, v: list[str]) -> list[str]:
        from gc25d_core.eval.live import LIVE_SWEEPS

        unknown = [s for s in v if s not in LIVE_SWEEPS]
        if unknown:
            raise ValueError(f"unknown live sweeps {unknown}; known: {sorted(LIVE_SWEEPS)}")
        return v


@dataclass(frozen=True)
class EvalExport:
    """One export to evaluate: ``label`` names it in the reports (stage, or stage_ema). The eval
    asset writes ``eval_input.json`` with ``path`` relative to the runs root (``relative_to``: the
    file stays true when the runs root moves); the job ``located`` it before reading it."""

    label: str
    path: Path
    sha256: str | None
    stage: str
    step: int
    recorded: str | None = None  # the path as eval_input.json names it (set by ``located``)

    def __post_init__(self) -> None:
        # the label names the export's folder of the eval's run folder (<label>/metrics.json)
        check_name(self.label, "label")

    def located(self, runs_root: Path | str) -> EvalExport:
        """The export with its file's path under ``runs_root`` (an absolute path stays as it is),
        keeping the name it was given as ``recorded``."""
        path = self.path if self.path.is_absolute() else Path(runs_root) / self.path
        return replace(self, path=path, recorded=str(self.path))

    def relative_to(self, runs_root: Path | str) -> EvalExport:
        """The export named relative to ``runs_root`` where its file lies inside it (as
        ``eval_input.json`` records it)."""
        from gc25d_core.handoff import runs_relative

        return replace(self, path=Path(runs_relative(self.path, runs_root)))


def exports_of_handoff(label: str, handoff: Path, runs_root: Path | str) -> list[EvalExport]:
    """The export of a hand-off file (teacher.json / final.json) and its EMA export, if it has one,
    resolved inside ``runs_root`` (gc25d_core.handoff)."""
    from gc25d_core.handoff import read_handoff

    h = read_handoff(handoff, runs_root)
    out = [EvalExport(label, h.export, h.sha256, h.stage, h.step)]
    if h.ema_export is not None:
        out.append(EvalExport(f"{label}_ema", h.ema_export, h.ema_sha256, h.stage, h.step))
    return out


class EvalInput(Strict):
    """``eval_input.json``: what the launching step found; the job evaluates exactly this."""

    manifest_version: int = Field(ge=0, description="the snapshot whose val split the cases come from")
    eval: EvalConfig
    exports: list[EvalExport] = Field(min_length=1, description="in chain order (EVAL_SOURCES)")
    not_evaluated: list[str] = Field(default_factory=list, description="sources without a hand-off yet")


class EvalOutput(Strict):
    """``eval_output.json``: what the job evaluated, next to the report files it wrote."""

    exports: list[str]  # labels, in table order; <label>/metrics.json each
    not_evaluated: list[str]
    plots: list[str]  # file names under the run folder, in the order report.md shows them
    num_cases: dict[str, int]
    # rollouts computed by this run per sweep, and the (export/sweep) rows taken from kept results
    computed: dict[str, int] = Field(default_factory=dict)
    kept: list[str] = Field(default_factory=list)
    # what the job's files depend on (eval.store.job_key, and the files it read by their identity):
    # the asset compares them before a launch (eval.store.finished_eval)
    job_key: str | None = None
    depends_on: dict[str, list[Any]] = Field(default_factory=dict)


M = TypeVar("M", "EvalInput", "EvalOutput")


def write_model(run_dir: Path, name: str, model: EvalInput | EvalOutput) -> Path:
    return atomic_write_text(Path(run_dir) / name, model.model_dump_json(indent=1))


def read_model(run_dir: Path, name: str, kind: type[M]) -> M:
    """One of the two files, validated; errors name the file and the field."""
    path = Path(run_dir) / name
    try:
        return kind.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist (written by the eval asset before the launch)") from None
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path))) from None
