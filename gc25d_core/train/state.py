"""The run state: named stateful parts saved together into rotating, atomically committed slots.

A slot ``<run_dir>/state/step-000500/`` holds every part's files (each rank writes its own), the data
cursor (``data.json``, gathered from every rank), ``trainer.json`` (step, engine, batch shape, world
size, snapshot) and ``sha256.json``, the SHA256 of every tensor file in it. It is filled in a shared
temp folder and renamed into place by rank 0 once every rank has written, so a kill at any moment
leaves the previous slot complete; exactly ``slots`` are kept. Resume is the default: the newest
slot that verifies restores every part. Parts write and read through ``SlotWriter`` / ``SlotReader``,
so every file is recorded at save and, at load, deserialised only after its hash matched and only by
``torch.load(weights_only=True)`` (gc25d_core.checkpoint).

Before a slot is trusted every file its record lists is hashed (the ranks share the files) and its
JSON read back. A slot that fails (a disk error, a truncated copy, a changed byte) is set aside as
``state/damaged-step-N`` and the next newest is tried: the run resumes from the newest slot that
verifies, says which one it skipped and why, and the rotation no longer counts the damaged one, so
the next saves cannot rotate the good slot away before a newer good one exists. When none verifies
the resume stops, naming every slot and what is wrong with it. The check costs one extra read of the
newest slot per resume (spread over the ranks); the loads still hash what they deserialise.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from gc25d_core.atomic import atomic_write_text
from gc25d_core.checkpoint import (
    CheckpointDir,
    StateFileError,
    check_recorded,
    load_torch,
    read_digests,
    recorded_digest,
    save_torch,
    seal_digests,
    step_name,
    write_digest_part,
)
from gc25d_core.distributed import barrier, dist_active, global_rank, world_size

# what must match between a slot and the config that resumes it; sharded engines add the world size
RESUME_KEYS = ("stage", "init", "engine", "micro_batch", "grad_accum")
SHARDED_ENGINES = ("zero2", "fsdp")


class SlotWriter:
    """What one rank writes into a slot being saved; every file's SHA256 is recorded."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.digests: dict[str, str] = {}

    def save(self, obj: Any, name: str) -> None:
        self.digests[name] = save_torch(obj, self.folder / name)

    def record(self, digests: dict[str, str]) -> None:
        """Files a library wrote itself (DeepSpeed's, recorded by our checkpoint engine)."""
        self.digests.update(digests)


class SlotReader:
    """A committed slot: files are loaded only when listed in its record, with a matching hash."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.digests = read_digests(folder)

    def load(self, name: str, map_location: Any = None) -> Any:
        digest = recorded_digest(self.digests, self.folder, name)
        return load_torch(self.folder / name, digest, map_location=map_location)


class Stateful(Protocol):
    """A part of the run state; ``save`` / ``load`` are called on every rank."""

    def save(self, slot: SlotWriter) -> None: ...

    def load(self, slot: SlotReader) -> None: ...


class RngState:
    """This rank's torch / numpy / Python (and CUDA) generator states, as tensors and plain data."""

    def _name(self) -> str:
        return f"rng-rank{global_rank()}.pt"

    def save(self, slot: SlotWriter) -> None:
        np_state = cast(tuple[Any, ...], np.random.get_state(legacy=True))
        state: dict[str, Any] = {
            "torch": torch.random.get_rng_state(),
            "numpy": [np_state[0], torch.from_numpy(np.asarray(np_state[1])), *np_state[2:]],
            "python": random.getstate(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        slot.save(state, self._name())

    def load(self, slot: SlotReader) -> None:
        state = slot.load(self._name())
        torch.random.set_rng_state(state["torch"])
        kind, keys, *rest = state["numpy"]
        np.random.set_state((kind, keys.numpy(), *rest))
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(frozen=True)
class DamagedSlot:
    """A slot that did not verify, and where it was set aside for inspection."""

    folder: Path
    reason: str
    set_aside_as: Path


@dataclass(frozen=True)
class ResumePoint:
    step: int
    folder: Path | None
    meta: dict[str, Any]
    data: dict[str, Any] | None  # the consumer cursor (opened before the parts are built)
    damaged: tuple[DamagedSlot, ...] = ()  # newer slots skipped because they did not verify


class RunState:
    def __init__(self, root: Path, slots: int):
        self.slots = CheckpointDir(root, keep=slots)

    def clean(self) -> None:
        """Rank 0: remove temp folders of saves that were killed."""
        self.slots.clean_tmp()

    def steps(self) -> list[int]:
        return self.slots.steps()

    def resume_point(self, expected: dict[str, Any], *, fresh: bool) -> ResumePoint:
        """Collective: the newest slot that verifies, checked against ``expected`` (RESUME_KEYS, and
        world_size for sharded engines); step 0 when there is none or ``fresh``. Newer slots that do
        not verify are set aside (``ResumePoint.damaged``); StateFileError when none verifies."""
        steps = [] if fresh else self.slots.steps()
        damaged: list[tuple[int, str]] = []
        good: int | None = None
        for step in reversed(steps):
            problem = verify_slot(self.slots.path(step), step)
            if problem is None:
                good = step
                break
            damaged.append((step, problem))
        if good is None:
            if damaged:
                listed = "; ".join(f"{step_name(step)}: {problem}" for step, problem in damaged)
                raise StateFileError(
                    f"{self.slots.root}: no state slot verifies, not resuming ({listed}); start over "
                    "with fresh, or put back a good copy of a slot"
                )
            return ResumePoint(0, None, {}, None)
        folder = self.slots.path(good)
        meta = _read_json(folder / "trainer.json")
        keys = RESUME_KEYS + (("world_size",) if expected.get("engine") in SHARDED_ENGINES else ())
        for key in keys:
            if meta.get(key) != expected.get(key):
                raise RuntimeError(
                    f"{folder / 'trainer.json'}: state has {key}={meta.get(key)!r}, the run "
                    f"{expected.get(key)!r} (sharded state resumes on the same world size; "
                    "start over with fresh)"
                )
        return ResumePoint(
            int(meta["step"]), folder, meta, _read_json(folder / "data.json"), self._set_aside(damaged)
        )

    def _set_aside(self, damaged: list[tuple[int, str]]) -> tuple[DamagedSlot, ...]:
        """Collective: rank 0 renames the damaged slots out of the rotation; every rank learns where."""
        if not damaged:
            return ()
        out = tuple(DamagedSlot(self.slots.path(s), why, self.slots.aside_name(s)) for s, why in damaged)
        barrier()  # every rank named the destinations before any rename changes the folder
        if global_rank() == 0:
            for (step, _), slot in zip(damaged, out, strict=True):
                self.slots.set_aside(step, slot.set_aside_as)
        barrier()
        return out

    def save(self, step: int, parts: dict[str, Stateful], meta: dict[str, Any], data: dict[str, Any]) -> Path:
        """Collective: every rank writes its parts into one temp folder, rank 0 adds the cursor and
        the meta and commits it as ``step-N``."""
        tmp = self.slots.shared_tmp(step)
        if global_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier()
        writer = SlotWriter(tmp)
        for part in parts.values():
            part.save(writer)
        write_digest_part(tmp, global_rank(), writer.digests)
        barrier()
        if global_rank() == 0:
            seal_digests(tmp)
            atomic_write_text(tmp / "data.json", json.dumps(data, sort_keys=True))
            atomic_write_text(tmp / "trainer.json", json.dumps({**meta, "step": step}, sort_keys=True))
        barrier()
        if global_rank() == 0:
            self.slots.commit(tmp, step)
        barrier()
        return self.slots.path(step)

    def load(self, point: ResumePoint, parts: dict[str, Stateful]) -> None:
        assert point.folder is not None
        reader = SlotReader(point.folder)  # refuses a slot without its SHA256 record
        for part in parts.values():
            part.load(reader)


def verify_slot(folder: Path, step: int) -> str | None:
    """Collective: why the slot ``folder`` cannot be resumed, None when it verifies: its JSON files
    read back (``trainer.json`` names ``step``), and every file its SHA256 record lists is there
    with that hash. The ranks hash a share of the files each and agree on the first problem."""
    rank, n_ranks = (global_rank(), world_size()) if dist_active() else (0, 1)
    problem: str | None
    try:
        meta = _read_json(folder / "trainer.json")
        if meta.get("step") != step:
            raise StateFileError(f"{folder / 'trainer.json'}: records step {meta.get('step')!r}, not {step}")
        _read_json(folder / "data.json")
        digests = read_digests(folder)
    except (RuntimeError, StateFileError) as e:
        problem = str(e)
    else:
        problem = check_recorded(folder, digests, sorted(digests)[rank::n_ranks])
    return next((p for p in _gather(problem) if p is not None), None)


def _gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (a collective when a process group of several runs)."""
    if not dist_active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{path}: unreadable run state ({e})") from None
    if not isinstance(data, dict):
        raise RuntimeError(f"{path}: run state must be a JSON object")
    return data
