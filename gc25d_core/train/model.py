"""Building a stage's GcDiT: the device and precision of the run, the init (random, Wan2.2, export)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import torch

from gc25d_core.config import Gc25dConfig
from gc25d_core.stage_config import ModelConfig, StageConfig

if TYPE_CHECKING:
    from gc25d_core.models.export import ExportMeta


def resolve_precision(stage: StageConfig, device: torch.device) -> Literal["bf16", "fp32"]:
    if stage.precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return stage.precision


def set_determinism(enabled: bool, seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        # no op here reads memory it did not write, so the NaN fill of every torch.empty (a debug
        # aid that comes with deterministic mode) changes no result; on a CPU it is a quarter of a
        # tiny model's step
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def dit_config_of(cfg: Gc25dConfig, model: ModelConfig):
    from gc25d_core.models.configs import full_config, tiny_config

    make = tiny_config if model.preset == "tiny" else full_config
    return make(vocab=cfg.vocab, **model.overrides)


def init_export(m: ModelConfig, runs_root: Path | str) -> tuple[Path, str | None]:
    """The export an ``export`` / ``handoff`` init reads, and the SHA256 it must have (a hand-off's
    exports are resolved inside ``runs_root``: gc25d_core.handoff)."""
    if m.init == "handoff":
        from gc25d_core.handoff import read_handoff
        from gc25d_core.schema import ConfigError

        if m.handoff is None:
            raise ConfigError(
                "model.init='handoff' needs model.handoff: the upstream stage's teacher.json / final.json "
                "(the stage asset sets it; by hand: <stage>.model.handoff=<run>/teacher.json)"
            )
        return read_handoff(m.handoff, runs_root).pick(m.handoff_export)
    assert m.export_path is not None
    return m.export_path, m.export_sha256


def init_source(m: ModelConfig, section: str) -> str:
    """Where an export init comes from, for errors: the hand-off file and its field, or the config field."""
    if m.init == "handoff":
        from gc25d_core.handoff import field_of

        return f"hand-off {m.handoff} (field {field_of(m.handoff_export)!r}, from {section}.handoff)"
    return f"{section}.export_path"


def check_init_export(
    cfg: Gc25dConfig, m: ModelConfig, meta: ExportMeta, path: Path, section: str, causal: bool | None
) -> None:
    """What the reading stage needs of its init export, before anything is trained: causal or
    bidirectional (``causal``; None: either), the project's vocabulary, the latent channels in and
    out, the text table's width. Raises a ConfigError naming the hand-off file and field."""
    from gc25d_core.config import LATENT_CHANNELS
    from gc25d_core.schema import ConfigError

    d = meta.dit_config
    problems: list[str] = []
    if causal is True and meta.causal is None:
        problems.append("it is bidirectional (causal=false); this stage needs a causal export")
    if causal is False and meta.causal is not None:
        problems.append("it is causal; this stage needs a bidirectional export (the SFT teacher)")
    if meta.vocab != cfg.vocab:
        problems.append(f"vocab={meta.vocab!r}, the project's ids are vocab={cfg.vocab!r}")
    for name, want in (
        ("in_dim", LATENT_CHANNELS),
        ("out_dim", LATENT_CHANNELS),
        ("text_dim", cfg.text.dim),
    ):
        if getattr(d, name) != want:
            problems.append(f"{name}={getattr(d, name)}, the data needs {want}")
    if problems:
        raise ConfigError(
            f"{init_source(m, section)}: the export {path} does not fit {section}: " + "; ".join(problems)
        )


def _load_init_export(
    cfg: Gc25dConfig,
    m: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    section: str,
    causal: bool | None,
):
    """An export init takes the export's architecture: a stage continues the model it starts from,
    so a teacher trained at other dims than the preset's (``model.overrides`` of its stage) is
    picked up as it is. The runtime switches in this stage's overrides apply; an architecture
    field there must agree with the export, and the export must fit the stage (``check_init_export``)."""
    from gc25d_core.models.configs import RUNTIME_FIELDS
    from gc25d_core.models.gcdit import GcDiT
    from gc25d_core.models.loading import load_gc_weights

    path, sha = init_export(m, cfg.paths.runs_root)
    loaded, meta = load_gc_weights(path, device=device, dtype=dtype, expected_sha256=sha)
    check_init_export(cfg, m, meta, path, section, causal)
    model = cast(GcDiT, loaded)
    have = meta.dit_config.model_dump()
    clash = {k: v for k, v in m.overrides.items() if k not in RUNTIME_FIELDS and have.get(k) != v}
    if clash:
        detail = ", ".join(f"{k}={v!r} (the export has {have.get(k)!r})" for k, v in clash.items())
        raise ValueError(f"init export {path}: model.overrides ask {detail}")
    if "fused_rmsnorm" in m.overrides:
        model.use_fused_rmsnorm(bool(m.overrides["fused_rmsnorm"]))
    if "per_cell_time" in m.overrides:
        model.per_cell_time = bool(m.overrides["per_cell_time"])
    return model


def build_model(
    cfg: Gc25dConfig,
    m: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    section: str = "model",
    causal: bool | None = None,
    kv_forwards: bool = False,
):
    """The init: random (seeded, same on every rank), Wan2.2 shards + fresh gc_sem_cond, or an export
    (``section`` names the config field in errors; ``causal``: what kind of export the stage needs;
    ``kv_forwards``: the model also runs KV-cache forwards)."""
    from gc25d_core.models.configs import build_gcdit

    if m.init == "random":
        with torch.random.fork_rng(devices=[]):  # the caller's CPU generator state is kept
            torch.manual_seed(m.init_seed)
            model = build_gcdit(dit_config_of(cfg, m), device=device, dtype=dtype)
    elif m.init == "wan":
        from gc25d_core.models.loading import build_gcdit_from_wan, wan_shard_paths

        assert m.wan_dir is not None
        model = build_gcdit_from_wan(
            wan_shard_paths(m.wan_dir),
            expected_sha256=m.wan_sha256,
            cfg=dit_config_of(cfg, m),
            device=device,
            dtype=dtype,
            seed=m.init_seed,
        )
    else:
        model = _load_init_export(cfg, m, device, dtype, section, causal)
    model.track_stats = True  # sem_rms / x_rms of each forward (no_grad, cheap)
    model.check_sem_ids = False  # checked on the host: SampleTransform.prepare and load_val_clips
    if m.attn_backend == "fa4":
        from gc25d_core.models.fa4 import check_fa4

        check_fa4(device)
    if m.flex_options.get("BACKEND") == "FLASH":  # flex's FlashAttention-4 (CuTe DSL) kernels
        from gc25d_core.models.fa4 import check_fa4

        check_fa4(device, "model.flex_options BACKEND='FLASH'")
    model.attn_backend = m.attn_backend
    model.flex_options = dict(m.flex_options)
    if m.compile:
        # a model that also runs KV forwards (stage 3's generator) keeps its attention eager: the
        # cache's key length changes with the window fill level
        model.enable_compile(eager_attention=kv_forwards)
    return model.train()


def param_groups(model: torch.nn.Module, lr: float, cond_lr: float | None) -> list[dict]:
    """Two AdamW groups: the DiT at ``lr``, the semantic-condition encoder at ``cond_lr``."""
    from gc25d_core.models.sem_cond import SEM_COND_NAME

    def is_sem(name: str) -> bool:
        # FSDP (use_orig_params) keeps the original names behind its wrapper prefixes
        return name.replace("_fsdp_wrapped_module.", "").startswith(f"{SEM_COND_NAME}.")

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sem = [p for n, p in named if is_sem(n)]
    dit = [p for n, p in named if not is_sem(n)]
    if not sem:
        raise ValueError(f"the model has no {SEM_COND_NAME}.* parameters")
    return [{"params": dit, "lr": lr}, {"params": sem, "lr": lr if cond_lr is None else cond_lr}]


def last_stats(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """GcDiT's sem_rms / x_rms of its last forward (``track_stats``)."""
    return cast(dict[str, torch.Tensor], getattr(module, "last_stats", {}))
