"""A damaged newest state slot does not stop a resume that an older slot can serve: the run resumes
from the newest slot that verifies, bit for bit as a run resumed from that slot, says which slot it
skipped and why, and keeps the damaged one aside (out of the rotation) for inspection. When no slot
verifies it stops, naming every slot and what is wrong with it.

A real tiny SFT run (torch engine, one rank in this process) to step 4 with slots at 2 and 4."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gc25d_core.checkpoint import StateFileError
from gc25d_core.report import StdoutReporter
from gc25d_core.train.loop import run_stage
from tests.train.resume_checks import assert_same_tensors, records, small_sft
from tests.train.world import sft_world

STEPS = 6
SFT = small_sft(STEPS, 2, 3)
NEWEST, OLDER = "step-000004", "step-000002"


class Recorder(StdoutReporter):
    """The stdout reporter of rank 0, keeping what it logged."""

    def __init__(self) -> None:
        super().__init__(rank=0)
        self.logged: list[tuple[str, str]] = []

    def log(self, message: str, level: str = "info") -> None:
        self.logged.append((level, message))
        super().log(message, level)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The run stopped at step 4 with two verified slots."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # multi-threaded CPU kernels are not bitwise reproducible run to run
    root = tmp_path_factory.mktemp("slot_fallback")
    cfg = sft_world(root, SFT)
    run_stage(cfg, "sft", root / "run", Recorder(), max_steps=4)
    assert sorted(p.name for p in (root / "run" / "state").iterdir()) == [OLDER, NEWEST]
    yield cfg, root / "run"
    torch.set_num_threads(before)


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage(slot: Path, how: str) -> Path:
    """Damage one file of ``slot`` the way a disk or a copy does; returns the file."""
    if how == "flipped byte":
        target = slot / "rng-rank0.pt"
        _flip_a_byte(target)
    elif how == "truncated":
        target = max((p for p in slot.rglob("*.pt")), key=lambda p: p.stat().st_size)  # the weights
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target = slot / "trainer.json"
        target.write_text(target.read_text()[:-3])
    return target


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "torn trainer.json"])
def test_resume_falls_back_to_the_older_slot_bit_for_bit(stopped, tmp_path, how, one_thread):
    cfg, stopped_run = stopped
    damaged_run = _copy(stopped_run, tmp_path / "damaged")
    target = _damage(damaged_run / "state" / NEWEST, how)
    damaged_bytes = target.read_bytes()
    # the reference: the same run resumed from the older slot, the newer one never there
    reference = _copy(stopped_run, tmp_path / "reference")
    shutil.rmtree(reference / "state" / NEWEST)

    rep = Recorder()
    summary = run_stage(cfg, "sft", damaged_run, rep)
    expected = run_stage(cfg, "sft", reference, Recorder())

    assert summary["resumed_from_step"] == expected["resumed_from_step"] == 2
    warnings = [m for level, m in rep.logged if level == "warning"]
    aside = damaged_run / "state" / f"damaged-{NEWEST}"
    assert any(
        str(damaged_run / "state" / NEWEST) in m and str(target) in m and str(aside) in m and OLDER in m
        for m in warnings
    ), warnings
    # the damaged slot is kept as it was found, out of the rotation; the resumed run saved anew
    assert (aside / target.relative_to(damaged_run / "state" / NEWEST)).read_bytes() == damaged_bytes
    assert sorted(p.name for p in (damaged_run / "state").iterdir()) == [
        f"damaged-{NEWEST}",
        NEWEST,
        f"step-{STEPS:06d}",
    ]
    assert records(damaged_run / "metrics.jsonl") == records(reference / "metrics.jsonl")
    assert [r["step"] for r in records(damaged_run / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert records(damaged_run / "val.jsonl") == records(reference / "val.jsonl")
    final = f"state/step-{STEPS:06d}"
    assert assert_same_tensors(damaged_run / final, reference / final, "*.pt") > 0
    for name in ("trainer.json", "data.json"):
        assert json.loads((damaged_run / final / name).read_text()) == json.loads(
            (reference / final / name).read_text()
        )


def test_no_slot_verifies_names_every_slot_and_moves_nothing(stopped, tmp_path):
    cfg, stopped_run = stopped
    run = _copy(stopped_run, tmp_path / "run")
    newest = _damage(run / "state" / NEWEST, "flipped byte")
    older = _damage(run / "state" / OLDER, "truncated")
    with pytest.raises(StateFileError) as caught:
        run_stage(cfg, "sft", run, Recorder())
    message = str(caught.value)
    assert "no state slot verifies" in message
    assert f"{NEWEST}: {newest}: SHA256" in message and f"{OLDER}: {older}: SHA256" in message
    assert sorted(p.name for p in (run / "state").iterdir()) == [OLDER, NEWEST]  # left for the user


def test_a_relaunch_with_no_slot_yet_logs_each_step_once(tmp_path, one_thread):
    """An attempt stopped before its first slot leaves records; the relaunch starts at step 0 and
    redoes them, so they are dropped, not kept beside the new ones."""
    cfg = sft_world(tmp_path, {**SFT, "max_steps": 3, "state_every": 100, "state_final": False})
    run = tmp_path / "run"
    run_stage(cfg, "sft", run, Recorder(), max_steps=2)  # stands in for an attempt killed at step 2
    assert not (run / "state").exists() or not list((run / "state").iterdir())
    summary = run_stage(cfg, "sft", run, Recorder())
    assert summary["resumed_from_step"] == 0
    assert [r["step"] for r in records(run / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in records(run / "val.jsonl")] == [3]
