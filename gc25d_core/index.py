"""SPEC §5: index/clips.jsonl and index/runs.json from a raw dataset snapshot.

One row per clip of index/clips_81.json with every SPEC column, plus ``ext_look_change`` (stage 3
uses cond_ext_canvas for those rows). The split is run-level: the configured val runs (v10's ten by
default) are "val", everything else "train". Drop lists flag clips (``drop`` + ``drop_reason``);
dropped clips are still processed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gc25d_core.atomic import atomic_write_text
from gc25d_core.config import DropListConfig, Gc25dConfig, IndexConfig, TimelineConfig
from gc25d_core.layout import Layout, clip_id, parse_clip_id
from gc25d_core.raw_layout import ClipEntry, RawSource, RunDir
from gc25d_core.timeline import check_clip_start, clip_end, extension_valid

SPLIT_RULE = (
    "run-level split: runs listed in index.val_runs are 'val', every other run is 'train'; "
    "all clips of a run share its split"
)


class IndexBuildError(ValueError):
    """The raw index or a drop list is inconsistent; the message names the file and field."""


class ClipRow(BaseModel):
    """One row of index/clips.jsonl (SPEC §5 columns + ext_look_change)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_id: str
    subset: str
    scene: str
    run: str
    start: int
    end: int
    split: str
    drop: bool
    drop_reason: str
    episode: int
    camera_variant: str
    look_name: str
    centered: bool
    n_events: int
    dead_frac: float
    has_ext: bool
    ortho: bool
    ext_look_change: bool


def read_drop_list(spec: DropListConfig) -> dict[str, str]:
    """clip ids (one per line; blank lines and '#' comments ignored) → reason."""
    try:
        lines = spec.path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise IndexBuildError(f"drop list {spec.path} does not exist") from None
    out: dict[str, str] = {}
    for n, line in enumerate(lines, start=1):
        cid = line.split("#", 1)[0].strip()
        if not cid:
            continue
        try:
            parse_clip_id(cid)
        except ValueError as e:
            raise IndexBuildError(f"{spec.path}:{n}: {e}") from None
        out[cid] = spec.reason
    return out


def split_of_runs(runs: Iterable[str], cfg: IndexConfig) -> dict[str, str]:
    runs = list(runs)
    missing = sorted(set(cfg.val_runs) - set(runs))
    if missing and not cfg.allow_missing_val_runs:
        raise IndexBuildError(f"index.val_runs: runs {missing} are not in the raw dataset")
    val = set(cfg.val_runs)
    return {r: ("val" if r in val else "train") for r in runs}


def clip_row(entry: ClipEntry, run: RunDir, split: str, drops: dict[str, str], tl: TimelineConfig) -> ClipRow:
    cid = clip_id(entry.scene, entry.run, entry.start)
    where = f"{run.path.parent.parent.parent / 'index' / 'clips_81.json'} clip {cid}"
    try:
        check_clip_start(entry.start, tl)
    except ValueError as e:
        raise IndexBuildError(f"{where}: field 'start': {e}") from None
    if entry.end != clip_end(entry.start, tl):
        raise IndexBuildError(f"{where}: field 'end'={entry.end}, expected start + {tl.num_frames}")
    frames = run.frames
    if entry.end > len(frames):
        raise IndexBuildError(f"{where}: field 'end'={entry.end} exceeds the run's {len(frames)} frames")
    clip = frames[entry.start : entry.end]
    first = clip[0]
    has_ext = extension_valid(
        [f.episode for f in frames], [f.camera_variant for f in frames], entry.start, tl
    )
    if has_ext:
        blocks_needed = entry.start // tl.frames_per_cell + tl.num_blocks + tl.num_ext_cells
        has_ext = len(run.actions_block) >= blocks_needed
    ext_look_change = has_ext and any(
        f.look_name != clip[-1].look_name for f in frames[entry.end : entry.end + tl.num_ext_frames]
    )
    return ClipRow(
        clip_id=cid,
        subset=entry.subset,
        scene=entry.scene,
        run=entry.run,
        start=entry.start,
        end=entry.end,
        split=split,
        drop=cid in drops,
        drop_reason=drops.get(cid, ""),
        episode=first.episode,
        camera_variant=first.camera_variant,
        look_name=first.look_name,
        centered=all(f.centered for f in clip),
        n_events=sum(f.event is not None for f in clip),
        dead_frac=sum(f.dead for f in clip) / len(clip),
        has_ext=has_ext,
        ortho=any(f.orthographic for f in clip),
        ext_look_change=ext_look_change,
    )


def build_index(raw: RawSource, cfg: Gc25dConfig) -> tuple[list[ClipRow], dict[str, str]]:
    """Rows in clips_81.json order and the run → split map."""
    runs = raw.runs()
    names = [r.run for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise IndexBuildError(
            f"{raw.clips_index_path}: run names {dupes} appear under several scenes/subsets"
        )
    splits = split_of_runs(names, cfg.index)
    drops: dict[str, str] = {}
    for spec in cfg.index.drop_lists:
        drops.update(read_drop_list(spec))
    by_key = {(r.subset, r.scene, r.run): r for r in runs}
    rows: list[ClipRow] = []
    seen: set[str] = set()
    for entry in raw.clips:
        row = clip_row(
            entry, by_key[(entry.subset, entry.scene, entry.run)], splits[entry.run], drops, cfg.timeline
        )
        if row.clip_id in seen:
            raise IndexBuildError(f"{raw.clips_index_path}: duplicate clip {row.clip_id}")
        seen.add(row.clip_id)
        rows.append(row)
    unknown = sorted(set(drops) - seen)
    if unknown:
        raise IndexBuildError(
            f"drop lists name clips not in the index: {unknown[:10]}{'…' if len(unknown) > 10 else ''}"
        )
    return rows, splits


def write_index(layout: Layout, rows: list[ClipRow], splits: dict[str, str]) -> None:
    """The index files, each rewritten only when its text changes: an unchanged index stays the
    same file (the clip jobs' records name it by size and modification time)."""
    body = "".join(json.dumps(r.model_dump(), sort_keys=False) + "\n" for r in rows)
    runs = {"_rule": SPLIT_RULE, **dict(sorted(splits.items()))}
    for path, text in ((layout.clips_jsonl, body), (layout.runs_json, json.dumps(runs, indent=1) + "\n")):
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
        except OSError:
            pass
        atomic_write_text(path, text)


def read_index(layout: Layout) -> list[ClipRow]:
    path = layout.clips_jsonl
    if not path.is_file():
        raise IndexBuildError(f"{path}: file does not exist (materialize clips_index first)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(ClipRow.model_validate_json(line))
            except ValueError as e:
                raise IndexBuildError(f"{path}:{n}: {e}") from None
    return rows


def index_summary(rows: list[ClipRow]) -> dict[str, int]:
    return {
        "num_clips": len(rows),
        "num_train": sum(r.split == "train" for r in rows),
        "num_val": sum(r.split == "val" for r in rows),
        "num_drop": sum(r.drop for r in rows),
        "num_has_ext": sum(r.has_ext for r in rows),
        "num_ext_look_change": sum(r.ext_look_change for r in rows),
        "num_runs": len({r.run for r in rows}),
    }


def build_and_write(raw_root: Path, cfg: Gc25dConfig) -> dict[str, int]:
    layout = Layout(Path(cfg.paths.data_root))
    rows, splits = build_index(RawSource(raw_root), cfg)
    write_index(layout, rows, splits)
    return index_summary(rows)
