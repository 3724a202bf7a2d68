"""The record a finished job keeps in its run folder (``job_done.json``): the config it ran under
and the files it read and wrote, by identity (size, mtime: ``hashing.file_identities``), with its
summary. The asset that would launch the job again reads it first, in its own process and without
model code: while every file is as the job left it under the same config, the job would only find
its work done, so the asset reports the summary instead of starting a process (a no-op rerun of
``make run`` in under a minute)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gc25d_core.atomic import atomic_write_text
from gc25d_core.hashing import file_identities

JOB_DONE = "job_done.json"


def keep_finished_job(
    run_dir: Path, inputs: Sequence[Path], outputs: Sequence[Path], summary: dict[str, Any]
) -> None:
    """What a finished job read and wrote, under the config.yaml its launch wrote in ``run_dir``."""
    record = {
        "config_sha256": hashlib.sha256((Path(run_dir) / "config.yaml").read_bytes()).hexdigest(),
        "inputs": file_identities(inputs),
        "outputs": file_identities(outputs),
        "summary": summary,
    }
    atomic_write_text(Path(run_dir) / JOB_DONE, json.dumps(record, sort_keys=True))


def finished_job(run_dir: Path, config_text: str) -> dict[str, Any] | None:
    """The summary of the job finished in ``run_dir`` under ``config_text`` (the config.yaml a
    launch would write) whose inputs and outputs are the files it left. None: launch it (it checks
    its work itself)."""
    try:
        record = json.loads((Path(run_dir) / JOB_DONE).read_text())
        if record["config_sha256"] != hashlib.sha256(config_text.encode()).hexdigest():
            return None
        for files in (record["inputs"], record["outputs"]):
            if file_identities(files) != files:
                return None
        return dict(record["summary"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
