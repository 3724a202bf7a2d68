"""Typed configuration: one pydantic tree per run (DESIGN.md §5).

Precedence: model defaults < preset YAML (configs/<name>.yaml) < overrides (dotted ``key=value``
strings or a nested dict). Every model forbids unknown keys, so a typo in a preset fails loudly
with the offending path. The resolved config is written to the run directory before work starts.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from gc25d_core.atomic import atomic_write_text
from gc25d_core.names import InvalidNameError, path_under
from gc25d_core.schema import ConfigError, Strict, format_validation_error
from gc25d_core.stages import STAGES

__all__ = ["ConfigError", "Gc25dConfig", "Strict", "format_validation_error", "load_config"]

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
DEFAULT_TEXT_DIR = CONFIGS_DIR / "text"
"""The project's prompt template, motion phrases and NULL prompt (``text.data_dir`` unset)."""

# SPEC §5: the channel count of a stored latent (the Wan2.2 VAE's z_dim, gc25d_core.models.vae.Z_DIM).
# Here, beside the latent's spatial size (GeometryConfig.latent_hw), because the file layout and the
# cache manifest check latents below models/ and without torch; models.vae builds its VAEs to it.
LATENT_CHANNELS = 48


class GeometryConfig(Strict):
    """SPEC §1: crop x∈[crop_x0, crop_x1) of src → dst (v10: 1280×704 → [30,1250) → 832×480)."""

    src_width: int = 1280
    src_height: int = 704
    crop_x0: int = 30
    crop_x1: int = 1250
    dst_width: int = 832
    dst_height: int = 480

    @model_validator(mode="after")
    def _check(self) -> GeometryConfig:
        if not (0 <= self.crop_x0 < self.crop_x1 <= self.src_width):
            raise ValueError(f"crop [{self.crop_x0},{self.crop_x1}) must lie inside [0,{self.src_width})")
        for name in ("dst_width", "dst_height"):
            if getattr(self, name) % 32:
                raise ValueError(f"{name}={getattr(self, name)} must be a multiple of 32 (VAE ×16, patch ×2)")
        return self

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.dst_height // 16, self.dst_width // 16


class TimelineConfig(Strict):
    """SPEC §2: 81 frames = 21 cells of 4 frames after the anchor; starts ∈ 96ℤ; 7 extension cells."""

    num_frames: int = 81
    frames_per_cell: int = 4
    clip_stride: int = 96
    num_ext_cells: int = 7

    @model_validator(mode="after")
    def _check(self) -> TimelineConfig:
        if (self.num_frames - 1) % self.frames_per_cell:
            raise ValueError("num_frames - 1 must be a multiple of frames_per_cell")
        if self.clip_stride % self.frames_per_cell:
            raise ValueError("clip_stride must be a multiple of frames_per_cell (blocks align with starts)")
        return self

    @property
    def num_cells(self) -> int:
        return 1 + (self.num_frames - 1) // self.frames_per_cell

    @property
    def num_blocks(self) -> int:
        return self.num_cells - 1

    @property
    def num_ext_frames(self) -> int:
        return self.num_ext_cells * self.frames_per_cell


V10_VAL_RUNS: tuple[str, ...] = (
    "R10_s1512",
    "R10_s3512",
    "R10_s5512",
    "R10_s7511",
    "R10_s9511",
    "P9_golden_s2909",
    "P9_autumn_s4908",
    "P9C_golden_s6946",
    "P9C_default_s8946",
    "P9C_snow_s10945",
)


class DropListConfig(Strict):
    path: Path
    reason: str


class IndexConfig(Strict):
    """SPEC §5: run-level split and drop lists."""

    val_runs: tuple[str, ...] = V10_VAL_RUNS
    drop_lists: tuple[DropListConfig, ...] = ()
    allow_missing_val_runs: bool = False


Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A SHA256 digest as 64 lowercase hex digits (hashlib's hexdigest, sha256sum's output)."""


class TextConfig(Strict):
    """SPEC §4: the text table. Without a table file the synthetic table of ``dim`` columns is used;
    a configured table file is used only when its bytes match ``table_sha256``."""

    data_dir: Path | None = Field(
        default=None,
        description="folder of template.txt, motions.json, null_prompt.txt; None: the project's own "
        "(configs/text, found where this code is at load time, so a resolved config names no checkout)",
    )
    table_path: Path | None = None
    table_sha256: Sha256Hex | None = Field(default=None, validate_default=True)
    max_len: int = 512
    dim: int = 4096
    synthetic_seed: int = 0

    @field_validator("table_sha256")
    @classmethod
    def _required_with_a_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        # an unverified table would silently condition every clip: no path without its hash
        if v is None and info.data.get("table_path") is not None:
            raise ValueError("required when text.table_path is set (the SHA256 of that file)")
        return v

    @property
    def text_dir(self) -> Path:
        """The folder the prompt data is read from: ``data_dir``, else the project's own."""
        return DEFAULT_TEXT_DIR if self.data_dir is None else self.data_dir


class RawConfig(Strict):
    """Where the raw dataset lives. ``kind='codeworld'`` generates it; ``'v10'`` validates a real one."""

    kind: Literal["codeworld", "v10"] = "v10"
    root: Path = Path("data/raw/GameCrafter-Data-v10")
    codeworld_preset: str = "tiny"
    seed: int = 0


class PathsConfig(Strict):
    data_root: Path = Path("data/gc25d_v10")
    runs_root: Path = Path("outputs")


def _one_plus_4k(v: int) -> int:
    if (v - 1) % 4:
        raise ValueError(f"frames = {v}: must be 1 + 4k (the VAE's causal cells)")
    return v


def _check_warm(warm: int, frames: int) -> None:
    """A window must keep a latent frame to score after its warm ones."""
    latents = 1 + (frames - 1) // 4
    if warm >= latents:
        raise ValueError(f"warm = {warm}: a window of frames = {frames} has {latents} latent frames")


class TinyVaeWarmPhaseConfig(Strict):
    """The tiny VAE fit's second phase: from the first phase's weights (Adam fresh), longer windows whose
    first latent frames are warm. Short windows train the cell a clip starts from; a whole clip is
    coded mostly on filled feature caches, which only warm windows train, and a warm fit never scores
    a window's first latent frame, so the two phases train both (docs/picture_study.md: a short warm
    phase after a short-window fit lifts the whole-clip picture; warm windows alone leave the first
    frame untrained)."""

    steps: int = Field(ge=1)
    batch: int = Field(ge=1)
    frames: int = Field(ge=5, description="frames per window (1 + 4k), the warm ones included")
    warm: int = Field(
        ge=1, description="latent frames at each window's start out of the loss, as vae.fit.warm"
    )
    lr: float = Field(gt=0)

    @field_validator("frames")
    @classmethod
    def _frames_one_plus_4k(cls, v: int) -> int:
        return _one_plus_4k(v)

    @model_validator(mode="after")
    def _warm_inside_the_window(self) -> TinyVaeWarmPhaseConfig:
        _check_warm(self.warm, self.frames)
        return self


class TinyVaeFitConfig(Strict):
    """Fitting the tiny VAE to the raw dataset's train-split frames (the ``tiny_vae`` asset,
    gc25d_core.models.vae_fit), so that tiny latents keep the picture the ids describe."""

    enabled: bool = Field(
        default=False,
        description="the tiny_vae asset fits one and latents use it (with vae.tiny and no vae.path)",
    )
    steps: int = Field(default=300, ge=1)
    batch: int = Field(default=2, ge=1)
    frames: int = Field(default=5, ge=1, description="frames per training window (1 + 4k)")
    dim: int = Field(
        default=16, ge=4, description="the encoder's base width (the real VAE's: 160); the file keeps it"
    )
    dec_dim: int = Field(
        default=16,
        ge=4,
        description="the decoder's base width (the real VAE's: 256): what the picture's detail costs "
        "(docs/picture_study.md); the file keeps it",
    )
    crop: int | None = Field(
        default=None,
        ge=16,
        description="square random crop of this side (multiple of 16) per window; None = whole frames. "
        "The VAE is convolutional, so a crop costs less per step and fits the same weights",
    )
    lr: float = Field(default=5e-4, gt=0)
    seed: int = 0
    threads: int = Field(
        default=2, ge=1, description="torch CPU threads: fixed, so the fit is the same on any machine"
    )
    norm_frames: int | None = Field(
        default=None,
        ge=1,
        description="frames per train clip the latent normalisation (per-channel mean / std) is measured "
        "on; None: whole clips, as the latents job encodes them (the first latent frame, one image "
        "frame, has its own statistics: a short window over-weights it)",
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="where the fit runs (cuda: the small preset's larger frames)"
    )
    compile: bool = Field(
        default=False,
        description="torch.compile the fit's loss (encode + decode: one graph), on CUDA replayed as CUDA "
        "graphs: at these widths the step is thousands of tiny kernels, launch-bound on a GPU. The "
        "weights differ within float rounding, so it is part of the fit's key",
    )
    fast_ops: bool = Field(
        default=False,
        description="the encode path's speed-ups in the fit: DiffSynth's causal conv / RMS norm with fewer "
        "copies and, on CUDA, channels-last-3d convs with cuDNN autotuning. The same math with other "
        "rounding, so part of the fit's key. On the GPU (the small preset) with bf16: 2.3× the plain fit's "
        "steps a second; on the CPU no gain, so off by default",
    )
    bf16: bool = Field(
        default=False,
        description="the fit's encode and decode under bfloat16 autocast (weights, Adam and the loss stay "
        "float32), for a GPU's tensor cores. Other rounding, so part of the fit's key. On in the "
        "small preset (with fast_ops); on the CPU the same fit in the same time, so off by default",
    )
    warm: int = Field(
        default=0,
        ge=0,
        description="latent frames at each window's start encoded and decoded without gradients and out "
        "of the loss: the rest train on the causal feature caches' filled state, where a whole clip's "
        "encode and decode run most of their frames (a window's start sees the caches' zeros), for a "
        "forward pass of the warm frames. Counted in frames (warm < 1 + (frames - 1) / 4); part of the "
        "fit's key when not 0",
    )
    class_weight: float = Field(
        default=0.0,
        ge=0,
        description="each pixel's squared error weighs p^-class_weight, p: the share of the train "
        "pixels of its id (the ids vocabulary: the player, the boss, each static class), scaled to a "
        "mean weight of 1, in both phases; 0 (off): the plain loss. The rare classes get more of the "
        "code than their area (docs/picture_study.md). Part of the fit's key when not 0",
    )
    state_every_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds of fitting between writes of the fit's progress (weights, Adam, the step) "
        "beside the weights: a killed fit, or one whose steps were raised, continues from it",
    )
    eval_frames: int = Field(
        default=17,
        ge=1,
        description="frames per clip (1 + 4k) of the reconstruction error in the metadata: the first "
        "ones of every held-out clip (a whole 81-frame decode per clip would cost more than it tells)",
    )
    then: TinyVaeWarmPhaseConfig | None = Field(
        default=None,
        description="a second phase on warm windows from this fit's weights; the file holds its result, "
        "the first phase's weights are kept beside it (.first.safetensors) so a rerun starts where it stopped",
    )
    file: str = Field(
        default="models/tiny_vae.safetensors",
        description="under paths.data_root; its SHA256 goes to the record file beside it (.json)",
    )

    @field_validator("frames", "eval_frames")
    @classmethod
    def _frames_one_plus_4k(cls, v: int) -> int:
        return _one_plus_4k(v)

    @model_validator(mode="after")
    def _warm_inside_the_window(self) -> TinyVaeFitConfig:
        _check_warm(self.warm, self.frames)
        return self

    @field_validator("crop")
    @classmethod
    def _multiple_of_16(cls, v: int | None) -> int | None:
        if v is not None and v % 16:
            raise ValueError(f"crop = {v}: must be a multiple of 16 (the VAE's spatial stride)")
        return v


class VaeConfig(Strict):
    """The Wan2.2 VAE used by the latents job. Real weights are verified by SHA256 before use."""

    path: Path | None = None
    sha256: str | None = None
    tiny: bool = Field(
        default=False,
        description="small VAE of the same class (tests, embedded default): the one at `path` "
        "(models.vae_fit) when path and sha256 are set, else the tiny_vae asset's fit when "
        "`fit.enabled`, else random",
    )
    fit: TinyVaeFitConfig = TinyVaeFitConfig()
    clips_per_batch: int = Field(default=1, ge=1, description="clips encoded together (GPU throughput)")
    num_workers: int = Field(
        default=2, ge=0, description="DataLoader workers that decode and resample frames"
    )
    allow_tf32_matmul: bool = False
    channels_last_3d: bool = Field(
        default=True,
        description="NDHWC conv weights (GPU: all, the same numerics, 1.3x faster encode on H200; CPU: the "
        "decoder's, the eval's batched decode a third faster within fp32 rounding)",
    )
    lean_ops: bool = Field(
        default=True,
        description="DiffSynth's causal conv / RMS norm with fewer copies (models.vae.lean_vae_ops); same results",
    )
    compute_dtype: Literal["fp32", "fp16"] = Field(
        default="fp32",
        description="fp32 = SPEC (fp32 weights, TF32 convs); fp16 autocast is an opt-in speed-up",
    )


class FastDecoderConfig(Strict):
    """The fast decoder (gc25d_core.models.fast_decoder, the ``fast_decoder`` asset): a small causal
    decoder distilled from ``vae``'s decoder on the processed latents, which deploy takes with
    ``--decoder fast``."""

    enabled: bool = Field(
        default=False,
        description="the fast_decoder asset fits one (off, the default: it does nothing, and make run "
        "stays as long as it was: the VAE decode of its targets alone is minutes on 2 CPU cores)",
    )
    steps: int = Field(default=300, ge=1)
    batch: int = Field(default=8, ge=1, description="latent cells per step")
    width: int = Field(default=32, ge=4, multiple_of=4, description="channels at the latent resolution")
    lr: float = Field(default=2e-3, gt=0)
    gt_weight: float = Field(
        default=0.25, ge=0, description="weight of the raw frames' MSE beside the VAE decode's (the teacher)"
    )
    seed: int = 0
    threads: int = Field(
        default=2, ge=1, description="torch CPU threads: fixed, so the fit is the same on any machine"
    )
    device: Literal["cpu", "cuda"] | None = Field(
        default=None, description="where it trains (None: `device`)"
    )
    max_clips: int = Field(
        default=32, ge=1, description="train clips at most (their VAE decode is held in memory)"
    )
    cells_per_clip: int = Field(
        default=6,
        ge=2,
        description="the first cells of every clip it trains and is measured on (the VAE decodes causally: "
        "its targets cost this share of whole clips)",
    )
    heldout_clips: int = Field(default=4, ge=0, description="val clips its PSNRs are measured on, at most")
    ckpt_every: int = Field(default=50, ge=1, description="steps between resume checkpoints")
    file: str = Field(
        default="models/fast_decoder.safetensors",
        description="under paths.data_root; its SHA256 goes to the record file beside it (.json)",
    )


class CacheConfig(Strict):
    """The training cache the trainers read (dataset card): where, and how processed clips are packed."""

    store: str = Field(
        default="data/gc25d_v10/cache", description="a folder, or hf://datasets/<owner>/<name>"
    )
    worker: str = "prep"
    samples_per_shard: int = Field(default=60, ge=1)
    include_cond: bool = True


class DistributedConfig(Strict):
    nproc_per_node: int = 8
    nnodes: int = 1
    backend: Literal["auto", "nccl", "gloo"] = "auto"


class RootConfig(Strict):
    """The run config's sections every run has; ``Gc25dConfig`` adds one per training stage."""

    name: str = "v10"
    seed: int = 0
    device: Literal["cpu", "cuda"] = "cuda"
    vocab: Literal["parts", "ids"] = "parts"
    paths: PathsConfig = PathsConfig()
    raw: RawConfig = RawConfig()
    geometry: GeometryConfig = GeometryConfig()
    timeline: TimelineConfig = TimelineConfig()
    index: IndexConfig = IndexConfig()
    text: TextConfig = TextConfig()
    vae: VaeConfig = VaeConfig()
    cache: CacheConfig = CacheConfig()
    fast_decoder: FastDecoderConfig = FastDecoderConfig()
    distributed: DistributedConfig = DistributedConfig()


def _with_stage_sections() -> type[RootConfig]:
    # one optional typed section per entry of the stage table, in table order after the others
    sections: dict[str, Any] = {
        s.name: (
            s.section | None,
            Field(default=None, description=f"{s.description} (configs/{s.preset_folder}/)"),
        )
        for s in STAGES
    }
    return create_model(
        "Gc25dConfig",
        __base__=RootConfig,
        __module__=__name__,
        __doc__="The whole resolved configuration of a preset: the sections of ``RootConfig`` and "
        "one optional section per training stage (gc25d_core.stages), ``cfg.sft``, ``cfg.stage1_tf``, ...",
        **sections,
    )


if TYPE_CHECKING:

    class Gc25dConfig(RootConfig):
        """The whole resolved configuration of a preset (the stage sections are derived, below)."""

        def __getattr__(self, name: str) -> Any: ...  # cfg.<stage>: a StageConfig or None

else:
    Gc25dConfig = _with_stage_sections()


def _key_parts(item: str, dotted: str) -> list[str]:
    if not dotted.strip():
        raise ConfigError(f"override {item!r}: the key before '=' is empty; expected key.path=value")
    parts = [p.strip() for p in dotted.split(".")]
    empty = [i for i, p in enumerate(parts) if not p]
    if empty:
        raise ConfigError(
            f"override {item!r}: key {dotted.strip()!r} has an empty part (number {empty[0] + 1}); "
            "expected key.path=value"
        )
    return parts


def _set_dotted(tree: dict[str, Any], item: str, parts: list[str], value: Any) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            section = ".".join(parts[: i + 1])
            raise ConfigError(f"override {item!r}: {section!r} is not a section")
        node = child
    node[parts[-1]] = value


def _yaml_value(item: str, key: str, raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        # the parser's own position line refers to the value text alone; keep only its problem
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"override {item!r}: the value of {key} is not valid YAML ({problem})") from e


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["timeline.num_frames=81", "index.val_runs=[a,b]"]`` → nested dict (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        dotted, raw = item.split("=", 1)
        parts = _key_parts(item, dotted)
        _set_dotted(tree, item, parts, _yaml_value(item, ".".join(parts), raw))
    return tree


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def preset_names() -> list[str]:
    """The bare preset names: configs/<name>.yaml."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))


def preset_path(preset: str | os.PathLike[str]) -> Path:
    """A path ending in .yaml / .yml is taken as is (an explicit preset file); anything else must be
    a bare name (gc25d_core.names) of a file configs/<name>.yaml. An unknown name fails naming the
    valid ones."""
    path = Path(preset)
    if path.suffix in (".yaml", ".yml"):
        return path
    valid = (
        f"the presets are {', '.join(preset_names())} (configs/<name>.yaml), or give a path to a .yaml file"
    )
    try:
        found = path_under(CONFIGS_DIR, str(preset), "preset", suffix=".yaml")
    except InvalidNameError as e:
        raise ConfigError(f"{e}; {valid}") from None
    if not found.is_file():
        raise ConfigError(f"preset {str(preset)!r} does not exist; {valid}")
    return found


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _resolve_relative(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Relative paths inside ``paths`` and ``raw.root`` are taken from the current directory, except
    ``text.data_dir`` / ``text.table_path`` which are relative to the preset file's folder."""
    text = data.get("text")
    if isinstance(text, dict):
        for key in ("data_dir", "table_path"):
            if isinstance(text.get(key), str) and not os.path.isabs(text[key]):
                text[key] = str((base_dir / text[key]).resolve())
    return data


def override_origins(overrides: list[str] | tuple[str, ...] | dict[str, Any] | None) -> dict[str, str]:
    """Dotted key → the override that set it, as the user wrote it (``sft.optim.lr=abc``); for a
    nested dict, each leaf as ``key=value``."""
    if not overrides:
        return {}
    if isinstance(overrides, dict):

        def leaves(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
            for k, v in tree.items():
                if isinstance(v, dict) and v:
                    yield from leaves(v, f"{prefix}{k}.")
                else:
                    yield f"{prefix}{k}", v

        return {key: f"{key}={value}" for key, value in leaves(overrides, "")}
    out = {}
    for item in overrides:
        dotted = item.split("=", 1)[0]
        out[".".join(p.strip() for p in dotted.split("."))] = item.strip()
    return out


def _config_error(err: ValidationError, source: str, origins: Mapping[str, str]) -> str:
    """One line per error that an override caused, naming it with its value: an error at or under
    the key it set, or a section's check over keys overrides set in it (with the preset's others).
    The remaining errors are listed under the preset file, as ``format_validation_error`` does."""
    by_override, from_file = [], []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        key = next(
            (k for k in sorted(origins, key=len, reverse=True) if loc == k or loc.startswith(k + ".")), None
        )
        inside = [v for k, v in origins.items() if loc and k.startswith(loc + ".")]
        if key is not None:
            where = "" if loc == key else f" ({loc})"
            by_override.append(f"override {origins[key]}: {e['msg']}{where}")
        elif inside:
            by_override.append(f"override {', '.join(inside)}: {loc}: {e['msg']} (with {source})")
        else:
            from_file.append(f"  {loc or '<root>'}: {e['msg']}")
    head = [f"{source}: invalid configuration", *from_file] if from_file else []
    return "\n".join(by_override + head)


def _over_stage_presets(data: Mapping[str, Any], tree: dict[str, Any], name: str) -> dict[str, Any]:
    """``tree`` with each stage section it overrides laid over that stage's preset file of the same
    name (configs/<stage>/<name>.yaml), where the preset YAML has no such section of its own: a
    stage's section is its preset file plus what the user changed (``sft.max_steps=500``), as the
    stage asset builds it, not the section's bare defaults."""
    out = dict(tree)
    for stage in STAGES:
        given = tree.get(stage.name)
        if not isinstance(given, dict) or data.get(stage.name) is not None:
            continue
        try:  # a name that is no file name has no stage file: the section's defaults then
            stage_file = path_under(CONFIGS_DIR / stage.preset_folder, name, "name", suffix=".yaml")
        except InvalidNameError:
            continue
        if stage_file.is_file():
            out[stage.name] = deep_merge(read_yaml(stage_file), given)
    return out


def load_config(
    preset: str | os.PathLike[str] = "tiny",
    overrides: list[str] | tuple[str, ...] | dict[str, Any] | None = None,
    origins: Mapping[str, str] | None = None,
) -> Gc25dConfig:
    """Resolve defaults < preset YAML < overrides into a validated ``Gc25dConfig``.

    An invalid value an override set is reported as that override (``origins``: dotted key → how
    the user wrote it; by default the overrides themselves), not as the preset file."""
    path = preset_path(preset)
    data = _resolve_relative(read_yaml(path), path.parent)
    tree = overrides if isinstance(overrides, dict) else parse_overrides(overrides) if overrides else {}
    # the stage files of the preset's name, as the stage assets pick them (``cfg.name``)
    name = str(tree.get("name") or data.get("name") or path.stem)
    data = deep_merge(data, _over_stage_presets(data, tree, name))
    try:
        return Gc25dConfig.model_validate(data)
    except ValidationError as e:
        named = override_origins(overrides) if origins is None else origins
        raise ConfigError(_config_error(e, str(path), named)) from None


def check_given_roots(cfg: Gc25dConfig, given: Mapping[str, str]) -> None:
    """The data roots a user gave (``given``: dotted field → how it was given) must hold data now.

    A preset's own roots may be created: the embedded default generates its code world and builds
    its processed data under data/<preset>/ on first run. A root the user names instead (an
    override, a resource field) must already exist: a typo or an unmounted disk would otherwise be
    created and filled silently. ``paths.data_root`` must be a folder (the processed data is written
    into it); ``raw.root`` of a real dataset (``raw.kind: v10``) must hold its index; a code world's
    raw root is generated, so it may be new."""
    if "paths.data_root" in given and not Path(cfg.paths.data_root).is_dir():
        raise ConfigError(
            f"{given['paths.data_root']}: paths.data_root {cfg.paths.data_root} is not an existing folder; "
            "create it first (the processed data is written into it) or leave paths.data_root at the preset's"
        )
    if "raw.root" in given and cfg.raw.kind == "v10":
        index = Path(cfg.raw.root) / "index" / "clips_81.json"
        if not index.is_file():
            raise ConfigError(
                f"{given['raw.root']}: raw.root {cfg.raw.root} holds no raw dataset ({index} is missing)"
            )


def config_from_yaml(path: Path) -> Gc25dConfig:
    """Load an already resolved config (as written by ``write_resolved``)."""
    try:
        return Gc25dConfig.model_validate(read_yaml(path))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path))) from None


def to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def write_resolved(cfg: BaseModel, run_dir: Path, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` atomically and return its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    atomic_write_text(path, to_yaml(cfg))
    return path
