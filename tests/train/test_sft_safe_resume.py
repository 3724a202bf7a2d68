"""Resuming SFT deserialises its state as data only: the DeepSpeed engine the trainer builds carries
our checkpoint engine (SHA256 check, then torch.load(weights_only=True)), and a pickle planted in a
state slot is refused, by its hash or by the weights-only unpickler, without ever running.

One rank in this process (a gloo group of one, as DeepSpeed needs a process group); the 2-rank
ZeRO-2 kill/resume bit-identity is tests/train/test_stage_torchrun.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gc25d_core.hashing import sha256_file
from gc25d_core.report import StdoutReporter
from gc25d_core.train.loop import run_stage
from gc25d_core.train.sft import SftRun, sft_config
from tests.train.world import sft_world

SFT = {
    "engine": "zero2",
    "max_steps": 2,
    "state_every": 2,
    "export_every": 100,
    "export_final": False,
    "data": {"num_workers": 0},
    "val": {"every": 100, "num_clips": 1},
}
SLOT = Path("state/step-000002")
MODEL_STATES = "model/mp_rank_00_model_states.pt"  # the ZeRO-2 engine tags its files by the model
OPTIM_STATES = "model/zero_pp_rank_0_mp_rank_00_optim_states.pt"


class RunsCode:
    """Unpickled with weights_only=False this calls ``os.mkdir(marker)``: any callable could stand there."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A gloo process group of one rank, with the LOCAL_RANK DeepSpeed asks torchrun for."""
    store = tmp_path_factory.mktemp("gloo") / "store"
    patch = pytest.MonkeyPatch()
    patch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    patch.undo()


@pytest.fixture(scope="module")
def trained(one_rank, tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_safe")
    cfg = sft_world(root, SFT)
    trainer = SftRun(cfg, sft_config(cfg), root / "run", StdoutReporter(rank=0))
    summary = trainer.run()
    assert summary["state_slots"] == ["step-000002"]
    return cfg, root / "run", trainer


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _resume_error(cfg, run: Path) -> Exception | None:
    try:
        run_stage(cfg, "sft", run, StdoutReporter(rank=0))
    except Exception as e:  # the caller asserts its type and message after checking the marker
        return e
    return None


def test_trainer_installs_the_safe_engine_and_records_every_state_file(trained, tmp_path):
    from gc25d_core.train.safe_load import SafeCheckpointEngine

    cfg, run, trainer = trained
    assert isinstance(trainer.model.ds_engine.checkpoint_engine, SafeCheckpointEngine)
    slot = run / SLOT
    digests = json.loads((slot / "sha256.json").read_text())
    assert sorted(digests) == sorted(p.relative_to(slot).as_posix() for p in slot.rglob("*.pt"))
    assert {MODEL_STATES, OPTIM_STATES, "rng-rank0.pt"} <= set(digests)
    assert all(sha256_file(slot / name) == digest for name, digest in digests.items())
    assert not list(slot.glob("sha256-rank*.json"))  # the per-rank parts were merged away
    # the allowlist is enough for what DeepSpeed really saved: a clean resume loads every file
    resumed = run_stage(cfg, "sft", _copy(run, tmp_path / "run"), StdoutReporter(rank=0))
    assert resumed["resumed_from_step"] == 2


@pytest.mark.parametrize(
    ("planted", "forged_record", "reason"),
    [
        (MODEL_STATES, False, "differs from the recorded"),  # refused by its hash
        (MODEL_STATES, True, "weights_only=True"),  # record forged too: refused by the unpickler
        (OPTIM_STATES, True, "weights_only=True"),  # the ZeRO optimizer shard loads the same way
    ],
)
def test_planted_pickle_is_not_executed_on_resume(trained, tmp_path, planted, forged_record, reason):
    cfg, run, _ = trained
    run = _copy(run, tmp_path / "run")
    marker = tmp_path / "code-ran"
    target = run / SLOT / planted
    torch.save({"module": RunsCode(marker), "optimizer_state_dict": RunsCode(marker)}, target)
    if forged_record:  # whoever can write the slot can also write a matching digest record
        record = run / SLOT / "sha256.json"
        digests = json.loads(record.read_text()) if record.is_file() else {}
        digests[planted] = sha256_file(target)
        record.write_text(json.dumps(digests))

    error = _resume_error(cfg, run)

    assert not marker.exists(), f"resuming unpickled {target} with weights_only=False: its code ran"
    from gc25d_core.checkpoint import StateFileError

    assert isinstance(error, StateFileError), repr(error)
    assert str(target) in str(error) and reason in str(error)
