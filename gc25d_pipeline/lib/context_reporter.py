"""The part of ``gc25d_core.report.Reporter`` that core work run inside the Dagster process uses
(the code world's generation, the cache's publication): lines and rate / ETA progress on the
asset's Dagster log, where a launched job's come through Pipes."""

from __future__ import annotations

import dagster as dg

from gc25d_core.report import Progress, log_to


class ContextReporter:
    rank = 0  # the one process: Progress logs its lines at info

    def __init__(self, context: dg.AssetExecutionContext):
        self.context = context

    def log(self, message: str, level: str = "info") -> None:
        log_to(self.context.log, message, level)

    def progress(self, total: int, unit: str = "items", every_s: float = 5.0, start: int = 0) -> Progress:
        return Progress(self, total, unit, every_s, start)  # type: ignore[arg-type]  # log and rank suffice
