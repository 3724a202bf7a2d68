"""The two evaluation sweeps (SPEC §10 names them; their definition is here and in docs/decisions.md).

A run's clips start every ``clip_stride`` = 96 frames = S = 24 cells; a clip has cells 0..20 (frames
s..s+80, latents for all 21) and, when ``has_ext``, extension cells 21..27 (frames s+81..s+108: ids
and prompts only, no latents). A rollout anchored at a clip's start s0 numbers its cells g = 0, 1, …
(cell g ≥ 1 = frames s0+4g−3 … s0+4g). Cell g ≥ 1 belongs to clip c = (g−1) // S of the chain
(start s0 + 96c) as its local cell j = g − S·c ∈ 1..S: the frames match exactly. Hence:

* ground truth of cell g: clip c's latent cell j when j ≤ 20 and that clip is in the snapshot (cell
  0: the anchor's own latent). Cells with j ∈ 21..24 have no latent anywhere (a clip's cell 0 is a
  one-frame encode, not the four frames of cell S·c). The VAE is causal and restarts at each clip's
  first frame, so a later clip's latents are its own encode, not a continuation of the first one's:
  the small difference is part of what those cells measure.
* conditioning of cell g (ids of its frames, its prompt): clip c's cond (j ≤ 20) or its extension
  (j ∈ 21..24); where that clip is missing or has no extension, UNKNOWN ids and the NULL prompt
  ("filled" cells, listed in the results).

``clip28``: for each has_ext val clip (sorted by run, start; the first ``clip28_clips``), 28 cells
anchored at its cell 0, conditioned on the clip's own ids and prompts for all 28 cells (cond + the
extension, even where a later clip exists). Ground truth: cells 0..20, and cells 25..27 from the
next clip (s+96, its cells 1..3) when that clip is in the snapshot and the extension is the raw
cond_ext (an ext_canvas extension re-draws the look of frames 0..80, which the real frames after
s+81 do not show). Cells 21..24 are measured without ground truth (flicker, latent RMS against the
clip's, condition sensitivity).

``chain241``: per val run (sorted; the first ``chain241_chains``), 61 cells = 241 frames anchored at
the run's clip start that gives the most conditioned cells, then the most ground-truth cells
(earliest on ties), conditioned per cell as above: with ext clips fully covered, ground truth at
cells 1..20, 25..44, 49..60.

Condition following (Genie's ΔtPSNR): every case is rolled out twice from the same anchor and noise,
with its own conditioning and with the next case's (cells ≥ 1; cell 0 keeps its own, it describes the
anchor frame); a sweep with one case uses its own cells ≥ 1 in reverse order instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gc25d_core.config import TimelineConfig
from gc25d_core.vocab import UNKNOWN

SWEEPS = ("clip28", "chain241")
SWEEP_CELLS = {"clip28": 28, "chain241": 61}
# the cell ranges the summary reports (inclusive): the trained length, and what lies beyond it
REGIONS: dict[str, dict[str, tuple[int, int]]] = {
    "clip28": {"1_20": (1, 20), "21_24": (21, 24), "22_27": (22, 27)},
    "chain241": {"1_20": (1, 20), "21_60": (21, 60), "49_60": (49, 60)},
}


@dataclass
class EvalClip:
    """One val sample of the snapshot, as the sweeps need it."""

    sample_id: str
    run: str
    start: int
    latent: torch.Tensor  # [48, 21, H, W]
    ids: torch.Tensor  # uint8 [81, h, w]
    keys: list[str]  # 21 text keys
    ext_ids: torch.Tensor | None = None  # uint8 [28, h, w]
    ext_keys: list[str] | None = None  # 7
    ext_source: str | None = None  # cond_ext | ext_canvas

    @property
    def has_ext(self) -> bool:
        return self.ext_ids is not None and self.ext_keys is not None


@dataclass
class Case:
    """One rollout of a sweep: conditioning for every cell, the anchor, the ground truth where it exists."""

    sweep: str
    case_id: str
    run: str
    start: int
    ids: torch.Tensor  # uint8 [1 + 4(N−1), h, w]
    keys: list[str]  # N text keys
    anchor: torch.Tensor  # [48, 1, H, W]
    gt_from: list[tuple[str, int] | None]  # per cell: (sample_id, local cell) of its ground truth
    filled: list[bool]  # per cell: conditioning filled with UNKNOWN / NULL
    other_ids: torch.Tensor | None = None  # the swapped conditioning (condition following)
    other_keys: list[str] | None = None
    other_from: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_cells(self) -> int:
        return len(self.keys)

    @property
    def has_gt(self) -> list[bool]:
        return [g is not None for g in self.gt_from]


def chain_cell(g: int, stride: int) -> tuple[int, int]:
    """Cell g of a rollout → (clip c of the chain, local cell j): cell 0 is (0, 0), g ≥ 1 is
    ((g−1) // S, g − S·c) with j ∈ 1..S."""
    if g == 0:
        return 0, 0
    c = (g - 1) // stride
    return c, g - stride * c


def _local(clip: EvalClip, j: int, tl: TimelineConfig) -> tuple[torch.Tensor, str] | None:
    """(ids of local cell j's frames, its key) from the clip's cond or extension; None if it has none."""
    fpc, n = tl.frames_per_cell, tl.num_cells
    frames = range(0, 1) if j == 0 else range(fpc * (j - 1) + 1, fpc * j + 1)
    if j < n:
        return clip.ids[frames.start : frames.stop], clip.keys[j]
    if not clip.has_ext or j >= n + tl.num_ext_cells:
        return None
    assert clip.ext_ids is not None and clip.ext_keys is not None
    lo, hi = frames.start - tl.num_frames, frames.stop - tl.num_frames
    return clip.ext_ids[lo:hi], clip.ext_keys[j - n]


def build_case(
    sweep: str,
    run_clips: Mapping[int, EvalClip],
    s0: int,
    num_cells: int,
    tl: TimelineConfig,
    null_key: str,
    *,
    own_clip_only: bool,
    gt_from_later: bool,
) -> Case:
    """The cells of a rollout anchored at start ``s0`` of a run (module doc). ``own_clip_only``: every
    cell is conditioned from the anchor clip (clip28); ``gt_from_later``: later clips' latents count
    as ground truth."""
    stride = tl.clip_stride // tl.frames_per_cell
    first = run_clips[s0]
    h, w = first.ids.shape[1:]
    ids, keys, gt_from, filled = [], [], [], []
    for g in range(num_cells):
        gc, gj = chain_cell(g, stride)
        c, j = (0, g) if own_clip_only else (gc, gj)
        clip = run_clips.get(s0 + tl.clip_stride * c)
        got = None if clip is None else _local(clip, j, tl)
        if got is None:
            n_frames = 1 if g == 0 else tl.frames_per_cell
            ids.append(torch.full((n_frames, h, w), UNKNOWN, dtype=torch.uint8))
            keys.append(null_key)
            filled.append(True)
        else:
            ids.append(got[0])
            keys.append(got[1])
            filled.append(False)
        gclip = run_clips.get(s0 + tl.clip_stride * gc)
        ok = gclip is not None and gj < tl.num_cells and (gc == 0 or gt_from_later)
        gt_from.append((gclip.sample_id, gj) if ok and gclip is not None else None)
    return Case(
        sweep=sweep,
        case_id=f"{first.run}@{s0}",
        run=first.run,
        start=s0,
        ids=torch.cat(ids, dim=0),
        keys=keys,
        anchor=first.latent[:, :1].float(),
        gt_from=gt_from,
        filled=filled,
        info={"anchor_clip": first.sample_id, "ext_source": first.ext_source},
    )


@dataclass(frozen=True)
class ClipInfo:
    """What selecting the sweeps' clips needs (a cache sample's JSON, no tensors)."""

    sample_id: str
    run: str
    start: int
    has_ext: bool
    ext_source: str | None = None


def by_run(clips: Sequence[Any]) -> dict[str, dict[int, Any]]:
    """run -> start -> clip (EvalClip or ClipInfo)."""
    out: dict[str, dict[int, Any]] = {}
    for clip in clips:
        run = out.setdefault(clip.run, {})
        if clip.start in run:
            raise ValueError(f"two val clips of run {clip.run} start at {clip.start}: {clip.sample_id}")
        run[clip.start] = clip
    return out


def chain_score(run: Mapping[int, Any], s0: int, num_cells: int, tl: TimelineConfig) -> tuple[int, int]:
    """(conditioned cells, ground-truth cells) of a chain anchored at ``s0`` (the rules of build_case)."""
    stride = tl.clip_stride // tl.frames_per_cell
    cond = gt = 0
    for g in range(num_cells):
        c, j = chain_cell(g, stride)
        clip = run.get(s0 + tl.clip_stride * c)
        if clip is None:
            continue
        cond += j < tl.num_cells or (clip.has_ext and j < tl.num_cells + tl.num_ext_cells)
        gt += j < tl.num_cells
    return cond, gt


def select_clip28(infos: Sequence[ClipInfo], max_cases: int) -> list[ClipInfo]:
    return sorted((c for c in infos if c.has_ext), key=lambda c: (c.run, c.start))[:max_cases]


def select_chain241(
    infos: Sequence[ClipInfo], max_cases: int, tl: TimelineConfig, num_cells: int = 61
) -> list[tuple[str, int]]:
    """(run, s0) per val run (sorted, the first ``max_cases``): the most conditioned cells, then the
    most ground-truth cells, then the earliest start."""
    out = []
    for run, clips in sorted(by_run(infos).items())[:max_cases]:
        best = max(sorted(clips), key=lambda s: (*chain_score(clips, s, num_cells, tl), -s))
        out.append((run, best))
    return out


def needed_clips(
    infos: Sequence[ClipInfo],
    tl: TimelineConfig,
    clip28: Sequence[ClipInfo],
    chains: Sequence[tuple[str, int]],
    chain_cells: int = 61,
) -> set[str]:
    """Sample ids whose tensors the selected cases read (the clip, the later clips of its chain)."""
    runs = by_run(infos)
    need = set()
    for c in clip28:
        need.add(c.sample_id)
        if (nxt := runs[c.run].get(c.start + tl.clip_stride)) is not None:
            need.add(nxt.sample_id)
    stride = tl.clip_stride // tl.frames_per_cell
    for run, s0 in chains:
        for k in range(chain_cell(chain_cells - 1, stride)[0] + 1):
            if (clip := runs[run].get(s0 + tl.clip_stride * k)) is not None:
                need.add(clip.sample_id)
    return need


def clip28_cases(
    clips: Sequence[EvalClip],
    picked: Sequence[ClipInfo],
    tl: TimelineConfig,
    null_key: str,
    num_cells: int = 28,
) -> list[Case]:
    runs = by_run(clips)
    cases = [
        build_case(
            "clip28",
            runs[c.run],
            c.start,
            num_cells,
            tl,
            null_key,
            own_clip_only=True,
            gt_from_later=c.ext_source == "cond_ext",
        )
        for c in picked
    ]
    return with_swaps(cases)


def chain241_cases(
    clips: Sequence[EvalClip],
    chains: Sequence[tuple[str, int]],
    tl: TimelineConfig,
    null_key: str,
    num_cells: int = 61,
) -> list[Case]:
    runs = by_run(clips)
    cases = [
        build_case(
            "chain241", runs[run], s0, num_cells, tl, null_key, own_clip_only=False, gt_from_later=True
        )
        for run, s0 in chains
    ]
    return with_swaps(cases)


def with_swaps(cases: list[Case]) -> list[Case]:
    """Attach each case's swapped conditioning: the next case's cells ≥ 1 (one case: its own reversed)."""
    for i, case in enumerate(cases):
        fpc = (case.ids.shape[0] - 1) // max(1, case.num_cells - 1)
        if len(cases) > 1:
            other = cases[(i + 1) % len(cases)]
            rest_ids, rest_keys, src = other.ids[1:], other.keys[1:], other.case_id
        else:
            cells = case.ids[1:].unflatten(0, (case.num_cells - 1, fpc))
            rest_ids, rest_keys, src = cells.flip(0).flatten(0, 1), case.keys[1:][::-1], "reversed"
        case.other_ids = torch.cat([case.ids[:1], rest_ids], dim=0)
        case.other_keys = [case.keys[0], *rest_keys]
        case.other_from = src
    return cases
