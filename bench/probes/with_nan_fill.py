"""A training job with deterministic mode's NaN fill of new memory back on, the fill that
``gc25d_core.train.model.set_determinism`` turns off: ``bench.speed.sft``'s ``+nanfill`` variants
run ``python -m bench.probes.with_nan_fill <job module> <its arguments>`` to measure what the fill
costs beside the default, at the same losses.

The job itself is unchanged: its module runs as ``__main__`` after the training loop's
``set_determinism`` is wrapped (the fill follows the stage's ``deterministic``)."""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m bench.probes.with_nan_fill <job module> [its arguments]")
    import torch

    import gc25d_core.train.loop as loop
    from gc25d_core.train.model import set_determinism

    def with_fill(enabled: bool, seed: int) -> None:
        set_determinism(enabled, seed)
        torch.utils.deterministic.fill_uninitialized_memory = enabled

    loop.set_determinism = with_fill
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
