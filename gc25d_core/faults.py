"""Fault injection for tests of crash, retry and resume paths. Inert unless GC25D_FAULT is set."""

from __future__ import annotations

import os

from gc25d_core.distributed import global_rank


class InjectedFault(RuntimeError):
    """Raised by ``maybe_inject_fault``; only ever triggered through GC25D_FAULT."""


def maybe_inject_fault(step: int, retry_number: int | None = None) -> None:
    """Test hook: GC25D_FAULT="rank=1,step=3[,attempt=0][,mode=raise|exit]" fails that rank at that step.

    ``attempt`` matches the Dagster retry number (GC25D_RETRY_NUMBER), so a test can fail the first
    attempt only and watch the retry resume. ``rank=any`` fails every rank that sees the variable:
    set in one node's environment only, it fails that node whatever global ranks the rendezvous
    gave it. Unset in production.
    """
    spec = os.environ.get("GC25D_FAULT")
    if not spec:
        return
    fields = dict(item.split("=", 1) for item in spec.split(",") if item)
    rank = fields.get("rank", "-1")
    if (rank != "any" and int(rank) != global_rank()) or int(fields.get("step", -1)) != step:
        return
    attempt = int(os.environ.get("GC25D_RETRY_NUMBER", "0")) if retry_number is None else retry_number
    if "attempt" in fields and int(fields["attempt"]) != attempt:
        return
    if fields.get("mode", "raise") == "exit":
        os._exit(3)
    raise InjectedFault(f"injected fault on rank {global_rank()} at step {step} (attempt {attempt})")
