"""Shared entry of the per-clip preprocessing jobs: read the index, pick the rows, run the task."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gc25d_core.config import Gc25dConfig
from gc25d_core.index import ClipRow, read_index
from gc25d_core.jobs.common import base_parser, run_job
from gc25d_core.layout import Layout
from gc25d_core.preprocess.runner import ClipTask, run_task
from gc25d_core.report import Reporter

TaskFactory = Callable[[Gc25dConfig], ClipTask]
RowFilter = Callable[[ClipRow], bool]


def main_for(factory: TaskFactory, row_filter: RowFilter | None = None) -> None:
    def main(args: argparse.Namespace, cfg: Gc25dConfig, rep: Reporter) -> None:
        layout = Layout(Path(cfg.paths.data_root))
        rows = [r for r in read_index(layout) if row_filter is None or row_filter(r)]
        if args.limit:
            rows = sorted(rows, key=lambda r: r.clip_id)[: args.limit]
        task = factory(cfg)
        rep.log(f"{task.name}: {len(rows)} clips")
        # a job over every clip keeps its record: the asset skips a launch that would build nothing
        run_task(task, rows, rep, args.run_dir, index=None if args.limit else layout.clips_jsonl)

    p = base_parser("per-clip preprocessing job")
    p.add_argument("--limit", type=int, default=0, help="only the first N clips by clip_id (smoke runs)")
    run_job(p, main)
