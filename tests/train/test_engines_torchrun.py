"""The shared training core under torchrun (2 gloo ranks) with two trained models in one run (the
pair stage, tests/train/pair_stage.py): FSDP FULL_SHARD and plain DDP train a generator and a critic
with an EMA, and a run killed after the EMA started resumes to bit-identical weights, optimizer
states, EMA shadow, RNG and loss curve."""

from __future__ import annotations

import pytest
import torch

from tests.train.resume_checks import assert_same_tensors, launch, records

pytestmark = pytest.mark.slow

STEPS, EMA_START, KILL_AT = 8, 3, 6  # state every 2: the killed run resumes from step 4, EMA running


@pytest.fixture(scope="module", params=["fsdp", "torch"])
def runs(request, tmp_path_factory):
    engine = request.param
    root = tmp_path_factory.mktemp(f"pair_{engine}")
    argv = [
        "tests/train/pair_stage.py",
        "--engine",
        engine,
        "--steps",
        str(STEPS),
        "--ema-start",
        str(EMA_START),
    ]
    full = launch([*argv, "--run-dir", str(root / "full")], nproc=2)
    assert full.returncode == 0, full.stderr[-4000:]
    killed = launch(
        [*argv, "--run-dir", str(root / "resumed")], nproc=2, fault=f"rank=1,step={KILL_AT},mode=exit"
    )
    assert killed.returncode != 0
    resumed = launch([*argv, "--run-dir", str(root / "resumed")], nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return engine, root / "full", root / "resumed", resumed.stdout


def test_two_models_train_in_one_run(runs):
    engine, full, _, _ = runs
    curve = records(full / "metrics.jsonl")
    assert [r["step"] for r in curve] == list(range(1, STEPS + 1))
    assert all(r["critic_loss"] > 0 and r["gen_grad_norm"] > 0 for r in curve)
    assert [r["ema_started"] for r in curve] == [float(s >= EMA_START) for s in range(1, STEPS + 1)]
    slot = full / "state" / f"step-{STEPS:06d}"
    names = {p.name for p in slot.iterdir()}
    if engine == "fsdp":  # sharded: each rank its own generator, critic and EMA shard
        assert {f"{m}-rank{r}.pt" for m in ("generator", "critic", "ema-generator") for r in (0, 1)} <= names
    else:
        assert {"generator.pt", "critic.pt", "ema-generator-rank0.pt"} <= names
    assert (full / "accelerate.yaml").is_file() == (engine == "fsdp")


def test_the_ema_is_a_moving_average_not_a_copy(runs):
    from safetensors.torch import load_file

    _, full, _, _ = runs
    gen = load_file(str(full / "exports" / "generator" / f"step-{STEPS:06d}.safetensors"))
    ema = load_file(str(full / "exports" / "ema" / f"step-{STEPS:06d}.safetensors"))
    assert gen.keys() == ema.keys()
    assert any(not torch.equal(gen[k], ema[k]) for k in gen)


def test_killed_after_the_ema_started_resumes_bit_identically(runs):
    _, full, resumed, out = runs
    assert f"step {KILL_AT - 2}" in out and "resumed from" in out
    assert records(full / "metrics.jsonl") == records(resumed / "metrics.jsonl")
    slot = f"state/step-{STEPS:06d}"
    assert assert_same_tensors(full / slot, resumed / slot, "*.pt") > 0  # weights, optimizers, EMA, RNG
    assert assert_same_tensors(full / "exports", resumed / "exports", "*.safetensors") > 0
