"""Shared scaffolding of job entry points: argument parsing, process group, reporter, fault hooks."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from gc25d_core.config import Gc25dConfig, config_from_yaml
from gc25d_core.distributed import global_rank, process_group
from gc25d_core.report import Reporter, open_reporter

JobMain = Callable[[argparse.Namespace, Gc25dConfig, Reporter], None]


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", type=Path, required=True, help="resolved config YAML (written by the caller)")
    p.add_argument("--run-dir", type=Path, required=True, help="deterministic run folder (checkpoints, logs)")
    return p


def run_job(parser: argparse.ArgumentParser, main: JobMain, argv: list[str] | None = None) -> None:
    """Parse, init distributed, open the reporter (Pipes on rank 0 under Dagster), run ``main``."""

    @record
    def _entry() -> None:
        args = parser.parse_args(argv)
        cfg = config_from_yaml(args.config)
        with process_group(cfg.distributed.backend), open_reporter() as reporter:
            main(args, cfg, reporter)

    _entry()


class InjectedFault(RuntimeError):
    """Raised by ``maybe_inject_fault``; only ever triggered through GC25D_FAULT."""


def maybe_inject_fault(step: int, retry_number: int | None = None) -> None:
    """Test hook: GC25D_FAULT="rank=1,step=3[,attempt=0][,mode=raise|exit]" fails that rank at that step.

    ``attempt`` matches the Dagster retry number (GC25D_RETRY_NUMBER), so a test can fail the first
    attempt only and watch the retry resume. Unset in production.
    """
    spec = os.environ.get("GC25D_FAULT")
    if not spec:
        return
    fields = dict(item.split("=", 1) for item in spec.split(",") if item)
    if int(fields.get("rank", -1)) != global_rank() or int(fields.get("step", -1)) != step:
        return
    attempt = int(os.environ.get("GC25D_RETRY_NUMBER", "0")) if retry_number is None else retry_number
    if "attempt" in fields and int(fields["attempt"]) != attempt:
        return
    if fields.get("mode", "raise") == "exit":
        os._exit(3)
    raise InjectedFault(f"injected fault on rank {global_rank()} at step {step} (attempt {attempt})")
