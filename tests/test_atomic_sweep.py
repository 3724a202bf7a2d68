"""Temp files of killed writers in the processed layout: a writer killed with SIGKILL mid-write
leaves ``.tmp-*`` beside its target; the next preprocessing job removes it, writes the right
outputs, and never touches the temp file of a writer that is still alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from gc25d_core.atomic import is_stale_tmp, sweep_stale_tmp, tmp_prefix
from gc25d_core.config import load_config
from gc25d_core.layout import Layout, Shapes, read_cond, write_cond
from gc25d_core.preprocess.runner import ClipTask, run_task
from gc25d_core.report import StdoutReporter

from .train.world import synthetic_row

ROOT = Path(__file__).resolve().parent.parent

# Opens the atomic write of one layout file, writes part of it, and never finishes.
_BLOCKED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gc25d_core.atomic import atomic_path

    target, ready = Path(sys.argv[1]), Path(sys.argv[2])
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"half an npz")
            f.flush()
            ready.write_text("writing")
            time.sleep(600)
    """
)


def _start_blocked_writer(target: Path, ready: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_WRITER, str(target), str(ready)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, f"writer exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "writer never started writing"
        time.sleep(0.05)
    return proc


def test_job_sweeps_a_killed_writers_temp_file_and_keeps_a_live_ones(tmp_path):
    cfg = load_config("tiny", {"paths": {"data_root": str(tmp_path / "data"), "runs_root": str(tmp_path)}})
    layout, shapes = Layout(Path(cfg.paths.data_root)), Shapes.of(cfg)
    rows = [synthetic_row("R10_s2024", 96 * k, "train") for k in range(3)]
    killed = _start_blocked_writer(layout.cond(rows[0].clip_id), tmp_path / "killed.ready")
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    cond_dir = layout.cond(rows[0].clip_id).parent
    (dead_tmp,) = cond_dir.glob(".tmp-*")
    outside = Path(cfg.paths.data_root) / "elsewhere"  # not a folder this task writes: not swept
    outside.mkdir()
    other_tmp = outside / dead_tmp.name
    other_tmp.write_bytes(b"x")
    live = _start_blocked_writer(cond_dir / "unrelated.npz", tmp_path / "live.ready")
    try:
        (live_tmp,) = (p for p in cond_dir.glob(".tmp-*") if p != dead_tmp)

        def build(row):
            ids = np.full(shapes.cond, rows.index(row) + 1, np.uint8)
            return write_cond(layout, row.clip_id, ids, shapes).stat().st_size

        task = ClipTask(
            name="cond",
            outputs=lambda row: [layout.cond(row.clip_id)],
            is_done=lambda row: layout.cond(row.clip_id).is_file(),
            build=build,
        )
        summary = run_task(task, rows, StdoutReporter(rank=0), tmp_path / "run")
        assert summary["num_built"] == 3 and summary["num_failed"] == 0
        assert list(cond_dir.glob(".tmp-*")) == [live_tmp] and other_tmp.exists()
        for k, row in enumerate(rows):
            assert (read_cond(layout, row.clip_id, shapes) == k + 1).all()
    finally:
        live.kill()
        live.wait(timeout=60)
    assert sweep_stale_tmp(cond_dir) == [live_tmp]


def test_staleness_of_temp_files(tmp_path):
    host = tmp_prefix("x").split("~")[1]  # this host, as writers record it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    try:
        mine = tmp_path / f"{tmp_prefix('a.npz')}abc"
        alive = tmp_path / f".tmp-a.npz~{host}~{sleeper.pid}~abc"
        gone = tmp_path / f".tmp-a.npz~{host}~{dead.pid}~abc"
        foreign_fresh = tmp_path / ".tmp-a.npz~another-host~1~abc"
        foreign_old = tmp_path / ".tmp-a.npz~another-host~2~abc"
        untagged_old = tmp_path / ".tmp-shard-k2j3h.tar"  # names written before writers were tagged
        for p in (mine, alive, gone, foreign_fresh, foreign_old, untagged_old):
            p.write_bytes(b"x")
        week_ago = time.time() - 7 * 24 * 3600
        for p in (foreign_old, untagged_old):
            os.utime(p, (week_ago, week_ago))
        assert not is_stale_tmp(mine) and not is_stale_tmp(alive) and is_stale_tmp(gone)
        assert not is_stale_tmp(foreign_fresh) and is_stale_tmp(foreign_old) and is_stale_tmp(untagged_old)
        assert sorted(sweep_stale_tmp(tmp_path)) == sorted([gone, foreign_old, untagged_old])
        assert sorted(tmp_path.iterdir()) == sorted([mine, alive, foreign_fresh])
    finally:
        sleeper.kill()
        sleeper.wait(timeout=60)
