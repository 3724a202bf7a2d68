"""Shared scaffolding of job entry points: argument parsing, process group, reporter, fault hooks.

A rank binds itself to its torchrun before anything else: if torchrun is killed, the kernel kills
the rank too (gc25d_core.lifeline), rather than leave it running orphaned beside the retry. A job
then holds its run folder for its whole life (gc25d_core.run_lock): a second job launched into the
same folder fails on every rank before it touches anything.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from gc25d_core.compat import name_the_deepspeed_accelerator
from gc25d_core.config import Gc25dConfig, config_from_yaml
from gc25d_core.distributed import is_distributed_launch, process_group
from gc25d_core.lifeline import die_with_parent, register
from gc25d_core.numerics import resolve_vml_dispatch
from gc25d_core.report import Reporter, open_reporter
from gc25d_core.run_lock import hold_run_folder

JobMain = Callable[[argparse.Namespace, Gc25dConfig, Reporter], None]


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", type=Path, required=True, help="resolved config YAML (written by the caller)")
    p.add_argument("--run-dir", type=Path, required=True, help="deterministic run folder (checkpoints, logs)")
    return p


def _quiet_library_deprecations() -> None:
    """DeepSpeed's ZeRO-2 gathers its partitions with ``torch.distributed.all_gather_into_tensor``,
    which torch deprecates: every rank of every ZeRO-2 job would print that FutureWarning about a
    call that is not ours. Only that message is ignored (our own calls stay loud:
    tests/train/test_stage_torchrun.py)."""
    import warnings

    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
        category=FutureWarning,
    )


def run_job(parser: argparse.ArgumentParser, main: JobMain, argv: list[str] | None = None) -> None:
    """Bind to the launcher, parse, init distributed, lock the run folder, open the reporter (Pipes
    on rank 0), run ``main``."""
    die_with_parent()
    register("rank")

    @record
    def _entry() -> None:
        name_the_deepspeed_accelerator()  # before any import of DeepSpeed
        _quiet_library_deprecations()
        resolve_vml_dispatch()  # before any op runs MKL's vector maths on several threads
        args = parser.parse_args(argv)
        cfg = config_from_yaml(args.config)
        # the lock is collective (rank 0 takes it, every rank learns the outcome) and comes before
        # the reporter: a job that lost must not touch the folder at all
        with (
            process_group(cfg.distributed.backend),
            hold_run_folder(args.run_dir),
            open_reporter() as reporter,
        ):
            main(args, cfg, reporter)

    _entry()
    if is_distributed_launch():
        _exit_before_finalizing()


def _exit_before_finalizing() -> None:
    """End a rank whose job returned without the interpreter's finalization. After
    ``destroy_process_group`` gloo's worker threads can still hold the last reference to a finished
    collective's tensors (``all_gather_object``'s); freeing them takes the GIL, which a finalizing
    interpreter refuses by ending the thread inside a C++ destructor: std::terminate, SIGABRT, and a
    rank that fails after its work is done (about one latents job in ten on two CPU ranks; a core's
    backtrace: ``ProcessGroupGloo::runLoop`` → ``~AsyncAllgatherWork`` → ``take_gil`` →
    ``pthread_exit``; pytorch/pytorch#190489). Everything the job writes is closed by now (the run
    folder's lock, the reporter, atomic files); the streams are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
