"""SFT pieces in one process: config sections and the generated DeepSpeed config, the worker-side
dropouts, the TI2V inputs / loss mask, and the plain-torch engine's resume (DataLoader worker path)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gc25d_core.config import ConfigError, load_config
from gc25d_core.handoff import FINAL, TEACHER
from gc25d_core.report import StdoutReporter
from gc25d_core.stage_config import DropoutConfig, ProfileConfig, SftConfig
from gc25d_core.text import NULL_KEY, prompt_keys
from gc25d_core.train.data import SampleTransform
from gc25d_core.train.engine import deepspeed_config, lr_lambda
from gc25d_core.train.inputs import cell_mse, ti2v_inputs
from gc25d_core.train.loop import run_stage
from gc25d_core.train.metrics import StepProfiler
from gc25d_core.train.sft import sft_config, with_sft
from gc25d_core.vocab import UNKNOWN
from tests.train.world import sft_world

CURVE_KEYS = ("loss", "mse", "t_mean", "grad_norm", "lr", "cond_lr", "sem_rms", "x_rms", "epoch")
# two steps as bench/speed/sft.py runs them: no final state or export, no DataLoader worker
BENCH_SFT = {
    "engine": "torch",
    "max_steps": 2,
    "state_every": 100,
    "export_every": 100,
    "export_final": False,
    "state_final": False,
    "data": {"num_workers": 0},
    "val": {"every": 100, "num_clips": 1},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return sft_world(tmp_path_factory.mktemp("sft_unit"))


def test_presets_and_generated_deepspeed_config():
    v10 = sft_config(with_sft(load_config("v10"), "v10"))
    assert (v10.micro_batch, v10.grad_accum, v10.max_steps) == (1, 2, 20000)
    assert (v10.optim.lr, v10.optim.cond_lr, v10.optim.weight_decay, v10.optim.betas) == (
        1e-5,
        1e-4,
        0.01,
        (0.9, 0.999),
    )
    assert (v10.optim.warmup_steps, v10.optim.grad_clip, v10.export_every, v10.val.every) == (
        500,
        1.0,
        1000,
        500,
    )
    assert v10.val.timesteps == (200.0, 500.0, 800.0) and v10.val.num_clips == 16 and v10.state_slots == 2
    assert (v10.dropout.text, v10.dropout.cond, v10.dropout.unknown_mask) == (0.1, 0.05, 0.5)

    def ds_of(sec: SftConfig, world_size: int, precision: str):
        return deepspeed_config(
            sec.zero,
            micro_batch=sec.micro_batch,
            grad_accum=sec.grad_accum,
            grad_clip=sec.optim.grad_clip,
            world_size=world_size,
            precision=precision,
        )

    assert v10.engine == "zero2" and v10.zero.via == "accelerate"
    ds = ds_of(v10, 8, "bf16")
    assert ds["train_batch_size"] == 16 and ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"]["stage"] == 2 and ds["bf16"]["enabled"] and ds["gradient_clipping"] == 1.0
    assert "optimizer" not in ds and "scheduler" not in ds  # client AdamW + LambdaLR
    assert ds["zero_optimization"]["use_multi_rank_bucket_allreduce"] is True  # DeepSpeed's default
    per_owner = with_sft(load_config("v10"), "v10", {"zero": {"use_multi_rank_bucket_allreduce": False}})
    assert not ds_of(sft_config(per_owner), 8, "bf16")["zero_optimization"]["use_multi_rank_bucket_allreduce"]
    assert not ds_of(SftConfig(), 2, "fp32")["bf16"]["enabled"]
    with pytest.raises(ConfigError, match="sft.optim.lr"):
        load_config("tiny", {"sft": {"optim": {"lr": "fast"}}})
    with pytest.raises(ConfigError, match="no 'sft' section"):
        sft_config(load_config("tiny"))
    with pytest.raises(ValueError, match="wan_dir"):
        with_sft(load_config("tiny"), {"model": {"init": "wan"}})


def test_warmup_then_constant():
    f = lr_lambda(500)
    assert (
        f(0) == pytest.approx(1 / 500) and f(249) == pytest.approx(0.5) and f(499) == 1.0 and f(10**6) == 1.0
    )
    assert lr_lambda(0)(0) == 1.0


def _samples(cfg):
    from gc25d_core.cache import ConsumerConfig, LocalStore, StreamingCache

    ds = StreamingCache(
        LocalStore(cfg.cache.store), ConsumerConfig(split="train"), rank=0, world_size=1, collate_fn=None
    )
    return ds, [s for b in ds.iter_batches() for s in b.samples]


def _transform(cfg, dropout: DropoutConfig, ds):
    return SampleTransform(
        seed=3,
        dropout=dropout,
        prompt_to_key=prompt_keys(cfg),
        cfg=cfg,
        meta_root=cfg.paths.data_root,
        on_missing_meta="error",
    ).attach(ds)


def test_dropouts_are_seeded_per_sample_and_epoch(world):
    ds, samples = _samples(world)
    tr = _transform(world, DropoutConfig(text=0.5, cond=0.3, unknown_mask=0.5), ds)
    a = [tr.prepare(s) for s in samples]
    b = [tr.prepare(s) for s in reversed(samples)][::-1]  # order (worker, rank) does not matter
    assert [(p.text_dropped, p.cond_dropped, p.masked) for p in a] == [
        (p.text_dropped, p.cond_dropped, p.masked) for p in b
    ]
    assert all(torch.equal(x.ids, y.ids) and x.keys == y.keys for x, y in zip(a, b, strict=True))
    for p, s in zip(a, samples, strict=True):
        if p.text_dropped:
            assert p.keys == [NULL_KEY] * 21
        if p.cond_dropped:
            assert bool((p.ids == UNKNOWN).all()) and not p.masked
        if not (p.cond_dropped or p.masked):
            assert torch.equal(p.ids, s.tensors["cond_ids"])
    ds.epoch = 1  # another epoch draws again
    c = [tr.prepare(s) for s in samples]
    assert [(p.text_dropped, p.cond_dropped, p.masked) for p in a] != [
        (p.text_dropped, p.cond_dropped, p.masked) for p in c
    ]


def test_ids_outside_the_vocab_fail_in_the_data_worker_naming_the_sample(world):
    """The trainer's model skips its per-forward id check (a device sync); the worker checks instead."""
    ds, samples = _samples(world)
    tr = _transform(world, DropoutConfig(text=0.0, cond=1.0, unknown_mask=0.0), ds)
    s = samples[0]
    s.tensors = dict(s.tensors, cond_ids=s.tensors["cond_ids"].clone())
    s.tensors["cond_ids"][3, 0, 0] = 8  # not a 'parts' id
    with pytest.raises(ValueError, match=rf"{s.key.sample_id}: cond_ids: values \[8\]"):
        tr.prepare(s)  # even when the cond is about to be dropped


def test_unknown_masking_touches_static_pixels_only(world):
    ds, samples = _samples(world)
    tr = _transform(world, DropoutConfig(text=0.0, cond=0.0, unknown_mask=1.0), ds)
    fracs = []
    for s in samples:
        raw = s.tensors["cond_ids"].numpy()
        p = tr.prepare(s)
        assert p.masked and not p.cond_dropped and not p.text_dropped
        out = p.ids.numpy()
        changed = out != raw
        assert (out[changed] == UNKNOWN).all()
        assert (raw[changed] < 7).all()  # characters (10..21) are never masked
        assert np.array_equal(out[raw >= 10], raw[raw >= 10])
        fracs.append(p.masked_frac)
    assert 0 < np.mean(fracs) < 1


def test_ti2v_inputs_and_loss_mask(world):
    from gc25d_core.flow import WAN_SCHEDULE

    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 48, 21, 4, 8, generator=g)
    x0_, x_t, target = ti2v_inputs(
        WAN_SCHEDULE, x0, 800.0, torch.Generator().manual_seed(1), torch.device("cpu")
    )
    assert torch.equal(x_t[:, :, 0], x0[:, :, 0])  # the clean anchor
    assert not torch.equal(x_t[:, :, 1], x0[:, :, 1])
    pred = target.clone()
    assert cell_mse(pred, target).item() == 0.0  # exact velocity -> zero loss
    pred[:, :, 0] += 100.0
    assert cell_mse(pred, target).item() == 0.0  # cell 0 is excluded
    pred[:, :, 5] += 1.0
    assert cell_mse(pred, target).item() == pytest.approx(1 / 20)


def tb_scalars(run_dir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one TensorBoard scalar as TensorBoard reads the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def test_plain_torch_engine_resumes_exactly(world, tmp_path, one_thread):
    sft = {
        "engine": "torch",
        "max_steps": 6,
        "state_every": 2,
        "export_every": 3,
        "deterministic": False,
        "data": {"num_workers": 1},  # dropouts run in a DataLoader worker
        "val": {"every": 3, "num_clips": 1},
    }
    cfg = with_sft(world, "tiny", sft)
    # the run folders lie in the runs root, where the hand-off final.json names their exports
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"runs_root": tmp_path})})
    full = run_stage(cfg, "sft", tmp_path / "full", StdoutReporter(rank=0))
    assert full["final_step"] == 6 and full["state_slots"] == ["step-000004", "step-000006"]
    part = run_stage(cfg, "sft", tmp_path / "part", StdoutReporter(rank=0), max_steps=4)
    assert part["final_step"] == 4 and not (tmp_path / "part" / "done.json").exists()
    rest = run_stage(cfg, "sft", tmp_path / "part", StdoutReporter(rank=0))
    assert rest["resumed_from_step"] == 4 and (tmp_path / "part" / "done.json").exists()

    def curve(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [{k: json.loads(x)[k] for k in CURVE_KEYS} for x in lines]

    assert curve("full") == curve("part")
    # the TensorBoard curves of the resumed run: each step once, the same values as the full run
    assert tb_scalars(tmp_path / "part", "train/loss") == tb_scalars(tmp_path / "full", "train/loss")
    assert [s for s, _ in tb_scalars(tmp_path / "part", "train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in tb_scalars(tmp_path / "part", "val/cond_mse")] == [3, 4, 6]  # 4: the last of part
    a = torch.load(tmp_path / "full/state/step-000006/model.pt", weights_only=True)
    b = torch.load(tmp_path / "part/state/step-000006/model.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["scheduler"] == b["scheduler"]
    again = run_stage(cfg, "sft", tmp_path / "part", StdoutReporter(rank=0))  # nothing left to do
    assert again["resumed_from_step"] == 6 and again["final_step"] == 6
    assert (tmp_path / "part" / FINAL).is_file()
    (tmp_path / "part" / TEACHER).write_text("{}")  # as sft_teacher leaves it
    fresh = run_stage(cfg, "sft", tmp_path / "part", StdoutReporter(rank=0), max_steps=1, fresh=True)
    assert fresh["resumed_from_step"] == 0 and fresh["state_slots"] == ["step-000001"]
    assert fresh["exports"] == ["step-000001.safetensors"]
    # the old hand-offs name exports a fresh run deleted: gone, so no next stage starts from them
    assert not (tmp_path / "part" / FINAL).exists() and not (tmp_path / "part" / TEACHER).exists()


def test_deterministic_steps_are_the_same_without_the_nan_fill_of_new_memory(
    world, tmp_path, one_thread, monkeypatch
):
    """Deterministic mode skips its NaN fill of every ``torch.empty`` (set_determinism): the fill
    only shows reads of memory no op wrote, and the weights after some steps are the same with it."""
    import gc25d_core.train.loop as loop
    from gc25d_core.train.model import set_determinism

    was = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    sft = {**BENCH_SFT, "max_steps": 3, "deterministic": True, "state_final": True}
    cfg = with_sft(world, "tiny", sft)

    def with_fill(enabled: bool, seed: int) -> None:
        set_determinism(enabled, seed)
        torch.utils.deterministic.fill_uninitialized_memory = True

    try:
        run_stage(cfg, "sft", tmp_path / "lean", StdoutReporter(rank=0))
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
        monkeypatch.setattr(loop, "set_determinism", with_fill)
        run_stage(cfg, "sft", tmp_path / "filled", StdoutReporter(rank=0))
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.utils.deterministic.fill_uninitialized_memory = was[1]
    a = torch.load(tmp_path / "lean/state/step-000003/model.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "filled/state/step-000003/model.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_step_that_crosses_an_epoch_marks_each_sample_in_its_own_epoch(world, tmp_path):
    """Regression: an epoch budget that is not a multiple of grad_accum ends the epoch inside an
    optimizer step. The step's first micro-batches belong to the closing epoch; marking them
    consumed after advance_epoch put them into the next epoch's bitmask, and when the new epoch
    yielded them again the consumer raised "consumed twice" (seen on the embedded default: 13
    clips in shards of 4,4,4,1, 2 ranks, grad_accum 2, odd per-epoch budgets)."""
    # 1 rank, 8 train samples, micro_batch 1 -> 8 micro-batches per epoch; grad_accum 3 ->
    # step 3 = the last 2 of epoch 0 + the first of epoch 1, step 6 = the last of epoch 1 + 2 of epoch 2.
    sft = {
        "engine": "torch",
        "grad_accum": 3,
        "max_steps": 6,
        "state_every": 3,
        "export_every": 100,
        "export_final": False,
        "data": {"num_workers": 0},
        "val": {"every": 100, "num_clips": 1},
    }
    cfg = with_sft(world, "tiny", sft)
    out = run_stage(cfg, "sft", tmp_path / "run", StdoutReporter(rank=0))
    assert out["final_step"] == 6
    for step, epoch, n in ((3, 1, 1), (6, 2, 2)):
        data = json.loads((tmp_path / "run" / f"state/step-{step:06d}/data.json").read_text())
        done = sum(int(m, 16).bit_count() for m in data["consumed"].values())
        assert (data["epoch"], done) == (epoch, n)  # only the new epoch's samples


def test_step_profiler_writes_the_kernel_table_for_its_window_only(tmp_path):
    off = StepProfiler(ProfileConfig(), tmp_path / "off", enabled=True)  # start 0 = off
    off.before(1)
    off.after(1)
    assert off.prof is None and not (tmp_path / "off").exists()
    prof = StepProfiler(ProfileConfig(start=2, steps=2), tmp_path / "p", enabled=True)
    x = torch.randn(64, 64)
    for step in (1, 2, 3, 4):
        prof.before(step)
        (x @ x).sum()
        prof.after(step)
        assert (tmp_path / "p" / "ops.txt").is_file() == (step >= 3)
    assert "aten::mm" in (tmp_path / "p" / "ops.txt").read_text()
    assert (tmp_path / "p" / "trace.json").is_file()
    busy = json.loads((tmp_path / "p" / "gpu_busy.json").read_text())  # no device events on the CPU
    assert busy["window_s"] == 0 and busy["gaps"] == 0
    other_rank = StepProfiler(ProfileConfig(start=1, steps=1), tmp_path / "r1", enabled=False)
    other_rank.before(1)
    other_rank.after(1)
    assert not (tmp_path / "r1").exists()


def test_benchmark_run_without_final_state_or_export(world, tmp_path, one_thread):
    """state_final / export_final off (what bench/speed/sft.py asks): the last step writes
    neither the rotating state nor an export; the run still finishes and says so."""
    out = run_stage(with_sft(world, "tiny", BENCH_SFT), "sft", tmp_path / "run", StdoutReporter(rank=0))
    assert out["final_step"] == 2 and out["state_slots"] == [] and out["exports"] == []
    assert not list((tmp_path / "run" / "state").glob("step-*"))
    assert (tmp_path / "run" / "done.json").is_file()


def test_a_finished_run_keeps_its_numerics_and_the_teachers_table_names_them(world, tmp_path, one_thread):
    """done.json records the CPU, ATen's code path and the pins this process runs under (the
    tests' own), and the learning-signal table prints them under its header."""
    import os

    from gc25d_core.numerics import NUMERICS_PINS, cpu_identity
    from gc25d_core.train.previews import learning_signal_report

    run_stage(with_sft(world, "tiny", BENCH_SFT), "sft", tmp_path / "run", StdoutReporter(rank=0))
    numerics = json.loads((tmp_path / "run" / "done.json").read_text())["numerics"]
    assert numerics["pins"] == {name: os.environ.get(name) for name in NUMERICS_PINS}
    assert numerics["pins"]["MKL_CBWR"] == "AVX2,STRICT"  # tests/__init__.py's pin reached the record
    assert numerics["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert (numerics["cpu_vendor"], numerics["cpu"]) == cpu_identity()
    assert numerics["threads"] == 1 and numerics["torch"] == torch.__version__
    lines = learning_signal_report(tmp_path / "run").splitlines()
    assert lines[1].startswith("numerics: ") and "MKL_CBWR=AVX2,STRICT" in lines[1]
    assert lines[2].split() == ["step", "t", "cond", "uncond", "null", "txt", "gap"]


def test_a_resume_under_other_numerics_warns_that_it_will_not_match_to_the_bit(
    world, tmp_path, one_thread, capsys, monkeypatch
):
    """The state keeps the numerics it was saved under; a resume with the same ones says nothing,
    one where a kernel pin changed still resumes and warns, naming the pin and both values."""
    sft = {**BENCH_SFT, "state_every": 1, "state_final": True}
    cfg = with_sft(world, "tiny", sft)
    run_stage(cfg, "sft", tmp_path / "run", StdoutReporter(rank=0), max_steps=1)
    capsys.readouterr()
    run_stage(cfg, "sft", tmp_path / "run", StdoutReporter(rank=0), max_steps=1)
    assert "other numerics" not in capsys.readouterr().out
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    out = run_stage(cfg, "sft", tmp_path / "run", StdoutReporter(rank=0))
    assert out["resumed_from_step"] == 1 and out["final_step"] == 2
    warnings = [
        json.loads(x)["message"]
        for x in capsys.readouterr().out.splitlines()
        if x.startswith("{") and '"warning"' in x
    ]
    assert any("other numerics (MKL_CBWR: AVX2,STRICT -> COMPATIBLE)" in w for w in warnings), warnings


def test_masking_uses_the_meta_the_cache_sample_carries(world, tmp_path):
    """Packed samples carry their clip frames' world_to_clip / world_to_view / ground_z, so UNKNOWN
    masking needs no processed layout beside the cache; without them it reads meta_root."""
    from types import SimpleNamespace

    from gc25d_core.layout import Layout, Shapes, read_meta

    ds, samples = _samples(world)
    s = samples[0]
    keys = ("world_to_clip", "world_to_view", "ground_z")
    meta = read_meta(Layout(world.paths.data_root), s.meta["clip_id"], Shapes.of(world), False)
    for k in keys:
        assert np.array_equal(s.tensors[k].numpy(), meta[k][:81])
    assert s.tensors["world_to_clip"].dtype == torch.float64 and s.tensors["ground_z"].dtype == torch.float32
    rates = DropoutConfig(text=0.0, cond=0.0, unknown_mask=1.0)
    no_layout = SampleTransform(
        seed=3,
        dropout=rates,
        prompt_to_key=prompt_keys(world),
        cfg=world,
        meta_root=tmp_path / "no_layout",
        on_missing_meta="error",
    ).attach(ds)
    stripped = SimpleNamespace(
        key=s.key, meta=s.meta, tensors={k: v for k, v in s.tensors.items() if k not in keys}
    )
    carried_xy = no_layout.ground_xy(s)
    assert carried_xy is not None and carried_xy.shape[0] == 81
    np.testing.assert_array_equal(carried_xy, _transform(world, rates, ds).ground_xy(stripped))
    with pytest.raises(FileNotFoundError, match="meta_root"):
        no_layout.ground_xy(stripped)
    assert no_layout.prepare(s).masked


def test_data_wait_is_the_time_spent_waiting_for_micro_batches(world, tmp_path, one_thread, monkeypatch):
    """data_wait_s (per logged step) is the host time the trainer waited for its micro-batches: a
    data path slowed by 0.2 s per sample shows at least that per micro-batch, a fast one far less."""
    import time

    cfg = with_sft(world, "tiny", BENCH_SFT)  # num_workers 0: the transform runs in this process
    micro = sft_config(cfg).grad_accum * sft_config(cfg).micro_batch

    def waits(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["data_wait_s"] for x in lines]

    run_stage(cfg, "sft", tmp_path / "fast", StdoutReporter(rank=0))
    prepare = SampleTransform.prepare

    def slow_prepare(self, sample):
        time.sleep(0.2)
        return prepare(self, sample)

    monkeypatch.setattr(SampleTransform, "prepare", slow_prepare)
    run_stage(cfg, "sft", tmp_path / "slow", StdoutReporter(rank=0))
    fast, slow = waits("fast"), waits("slow")
    assert len(fast) == len(slow) == 2
    assert all(w >= 0.2 * micro for w in slow), (slow, micro)
    assert all(0 <= w < 0.2 * micro for w in fast), fast


def test_an_export_init_takes_the_exports_architecture(tmp_path):
    """A stage started from a teacher trained at other dims than its preset (the tiny SFT's
    model.overrides) builds the teacher's model; an architecture override that disagrees fails
    naming the field, a runtime switch applies."""
    from gc25d_core.models.configs import build_gcdit, tiny_config
    from gc25d_core.models.export import export_state_dict, save_export
    from gc25d_core.stage_config import ModelConfig
    from gc25d_core.train.model import build_model

    wide = tiny_config(dim=64, ffn_dim=128, num_layers=3)
    torch.manual_seed(0)
    teacher = build_gcdit(wide)
    path = save_export(tmp_path / "teacher.safetensors", teacher, dit_config=wide, data="codeworld")
    cfg = load_config("tiny")
    m = ModelConfig(preset="tiny", init="export", export_path=path, overrides={"fused_rmsnorm": True})
    model = build_model(cfg, m, torch.device("cpu"), torch.float32)
    assert model.gc_config.architecture() == wide.architecture()
    assert model.gc_config.architecture() != tiny_config().architecture()
    got, want = export_state_dict(model), export_state_dict(teacher)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(n.use_torch_norm for n in model.modules() if hasattr(n, "use_torch_norm"))

    clash = ModelConfig(preset="tiny", init="export", export_path=path, overrides={"num_layers": 2})
    with pytest.raises(ValueError, match=r"num_layers=2 \(the export has 3\)"):
        build_model(cfg, clash, torch.device("cpu"), torch.float32)


def test_flex_kernel_options_reach_the_model_and_need_the_flex_backend():
    from pydantic import ValidationError

    from gc25d_core.stage_config import ModelConfig
    from gc25d_core.train.model import build_model

    m = ModelConfig(preset="tiny", init="random", attn_backend="flex", flex_options={"USE_TMA": True})
    model = build_model(load_config("tiny"), m, torch.device("cpu"), torch.float32)
    assert model.attn_backend == "flex" and model.flex_options == {"USE_TMA": True}
    with pytest.raises(ValidationError, match="flex_options needs model.attn_backend 'flex', not 'sdpa'"):
        ModelConfig(preset="tiny", init="random", flex_options={"USE_TMA": True})
    flash = ModelConfig(preset="tiny", init="random", attn_backend="flex", flex_options={"BACKEND": "FLASH"})
    with pytest.raises(
        RuntimeError, match=r"model.flex_options BACKEND='FLASH' needs a CUDA device, got cpu"
    ):
        build_model(load_config("tiny"), flash, torch.device("cpu"), torch.float32)
