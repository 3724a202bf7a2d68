"""Code-world presets: which runs to generate, at which source geometry.

"tiny" (CI, the embedded default): six runs at src 200×96 → crop [6,194) → 128×64, 13 clips.

    subset       scene          run               frames  camera                    notes
    v10_real     ashen_keep     R10_s1512 (val)   205     tp_default                ext 0, 96
    v10_real     ashen_keep     R10_s2024         273     tp_high                   ext 0, 96; 192 too short
    v10_real     ember_court    R10_s3036         190     ortho_iso                 ext 0; 96 too short
    v9_stylized  sunken_garden  P9_golden_s2909   205     tp_default, framed        ext 0, 96 (val)
    v9_stylized  sunken_garden  P9C_golden_s3011  205     tp_default → tp_wide@150  ext 0; 96 camera change
    v9_stylized  frost_hall     P9C_snow_s4013    205     tp_default, respawn@140   ext 0; 96 episode change

v10_real runs swap their look (set dressing re-scattered) at s+81 of every clip start s, so every
v10_real extension has a look change; v9 runs keep one look (the style in the run name).

"small" (one GPU, the `small` run preset: a world model that learns in minutes): sixteen runs of
273 frames (3 clips each, 48 clips) over eight scenes, every camera, v10 and v9 styles, at src
400×192 → crop [10,390) → 256×128 (latents 16×8 per cell); the val runs are R10_s1512 and
P9_golden_s2909 (6 clips), as in tiny.

"full" (GPU-scale tests, not CI): 1280×704 v10 geometry, four runs of 81 + 28 = 109 frames (one clip
each, all with an extension): R10_s1512 (val), R10_s2024, P9_golden_s2909 (val), P9C_golden_s3011;
the v10_real runs swap their look at frame 81. About 0.5 s per frame per core.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from gc25d_core.codeworld.sim import LookSpan, RunSpec
from gc25d_core.config import GeometryConfig, TimelineConfig

TINY_GEOMETRY = GeometryConfig(
    src_width=200, src_height=96, crop_x0=6, crop_x1=194, dst_width=128, dst_height=64
)
SMALL_GEOMETRY = GeometryConfig(
    src_width=400, src_height=192, crop_x0=10, crop_x1=390, dst_width=256, dst_height=128
)
FULL_GEOMETRY = GeometryConfig()
_TL = TimelineConfig()


def name_seed(run: str) -> int:
    """The number after the last ``_s`` of a SPEC-shaped run name (R10_s1512 → 1512)."""
    m = re.search(r"_s(\d+)$", run)
    if not m:
        raise ValueError(f"run name {run!r} must end in _s<digits>")
    return int(m.group(1))


def stable_seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def v10_looks(scene: str, run: str, num_frames: int, seed: int) -> tuple[LookSpan, ...]:
    """Look k+1 starts at s+81 for the k-th clip start s (re-scattered set dressing)."""
    spans = [LookSpan(0, "scatter00", stable_seed(seed, scene, run, 0))]
    starts = range(0, num_frames - _TL.num_frames + 1, _TL.clip_stride)
    for k, s in enumerate(starts, start=1):
        if s + _TL.num_frames < num_frames:
            spans.append(LookSpan(s + _TL.num_frames, f"scatter{k:02d}", stable_seed(seed, scene, run, k)))
    return tuple(spans)


def _v10(scene: str, run: str, frames: int, camera: str, seed: int) -> RunSpec:
    return RunSpec(
        subset="v10_real",
        scene=scene,
        run=run,
        num_frames=frames,
        seed=stable_seed(seed, run, name_seed(run)),
        scene_seed=stable_seed(seed, scene),
        style="real",
        framed=False,
        cameras=((0, camera),),
        looks=v10_looks(scene, run, frames, seed),
    )


def _v9(
    scene: str,
    run: str,
    frames: int,
    seed: int,
    cameras: tuple[tuple[int, str], ...] = ((0, "tp_default"),),
    respawns: tuple[int, ...] = (),
) -> RunSpec:
    style = run.split("_")[1]
    return RunSpec(
        subset="v9_stylized",
        scene=scene,
        run=run,
        num_frames=frames,
        seed=stable_seed(seed, run, name_seed(run)),
        scene_seed=stable_seed(seed, scene),
        style=style,
        framed=not run.startswith("P9C_"),
        cameras=cameras,
        looks=(LookSpan(0, style, stable_seed(seed, scene, run, "look")),),
        respawns=respawns,
    )


def tiny_runs(seed: int) -> list[RunSpec]:
    return [
        _v10("ashen_keep", "R10_s1512", 205, "tp_default", seed),
        _v10("ashen_keep", "R10_s2024", 273, "tp_high", seed),
        _v10("ember_court", "R10_s3036", 190, "ortho_iso", seed),
        _v9("sunken_garden", "P9_golden_s2909", 205, seed),
        _v9("sunken_garden", "P9C_golden_s3011", 205, seed, cameras=((0, "tp_default"), (150, "tp_wide"))),
        _v9("frost_hall", "P9C_snow_s4013", 205, seed, respawns=(140,)),
    ]


def small_runs(seed: int) -> list[RunSpec]:
    n = 273  # clip starts 0, 96, 192: three clips, each with its 28-frame extension but the last
    v10 = [
        ("ashen_keep", "R10_s1512", "tp_default"),
        ("ashen_keep", "R10_s2024", "tp_high"),
        ("ember_court", "R10_s3036", "ortho_iso"),
        ("ember_court", "R10_s3140", "tp_default"),
        ("salt_quarry", "R10_s5210", "tp_wide"),
        ("salt_quarry", "R10_s5333", "tp_default"),
        ("iron_docks", "R10_s6102", "tp_high"),
        ("iron_docks", "R10_s6247", "tp_default"),
    ]
    v9 = [
        _v9("sunken_garden", "P9_golden_s2909", n, seed),
        _v9("sunken_garden", "P9C_golden_s3011", n, seed, cameras=((0, "tp_default"), (150, "tp_wide"))),
        _v9("frost_hall", "P9C_snow_s4013", n, seed, respawns=(140,)),
        _v9("frost_hall", "P9_snow_s4120", n, seed, cameras=((0, "tp_high"),)),
        _v9("moss_vault", "P9_golden_s7011", n, seed),
        _v9("moss_vault", "P9C_snow_s7102", n, seed, cameras=((0, "tp_wide"),)),
        _v9("glass_spire", "P9_golden_s8021", n, seed, cameras=((0, "tp_high"),)),
        _v9("glass_spire", "P9C_golden_s8140", n, seed, respawns=(120,)),
    ]
    return [_v10(scene, run, n, camera, seed) for scene, run, camera in v10] + v9


def full_runs(seed: int) -> list[RunSpec]:
    n = _TL.num_frames + _TL.num_ext_frames
    return [
        _v10("ashen_keep", "R10_s1512", n, "tp_default", seed),
        _v10("ashen_keep", "R10_s2024", n, "tp_high", seed),
        _v9("sunken_garden", "P9_golden_s2909", n, seed),
        _v9("sunken_garden", "P9C_golden_s3011", n, seed, cameras=((0, "tp_wide"),)),
    ]


@dataclass(frozen=True)
class Preset:
    name: str
    geometry: GeometryConfig
    runs: Callable[[int], list[RunSpec]]


PRESETS: dict[str, Preset] = {
    "tiny": Preset("tiny", TINY_GEOMETRY, tiny_runs),
    "small": Preset("small", SMALL_GEOMETRY, small_runs),
    "full": Preset("full", FULL_GEOMETRY, full_runs),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown code-world preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]
