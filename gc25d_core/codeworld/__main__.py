"""Command line of the code world.

    python -m gc25d_core.codeworld generate ROOT [--preset tiny|full] [--seed 0] [--workers N]
    python -m gc25d_core.codeworld sheet ROOT SUBSET SCENE RUN START OUT.png [--frames 0,20,40,60,80]

``generate`` prints the summary as JSON; ``sheet`` writes a contact sheet (RGB | ids | parts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gc25d_core.codeworld import contact_sheet
from gc25d_core.codeworld.presets import PRESETS
from gc25d_core.codeworld.writer import generate
from gc25d_core.report import StdoutReporter


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sheet"]:
        contact_sheet.main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m gc25d_core.codeworld", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a preset in the raw layout (idempotent)")
    g.add_argument("root", type=Path)
    g.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--workers", type=int, default=None)
    sub.add_parser("sheet", help="contact sheet of a clip (see gc25d_core.codeworld.contact_sheet)")
    a = ap.parse_args(argv)
    rep = StdoutReporter(rank=0, bars=True)  # a frame bar on a terminal, rate lines elsewhere
    summary = generate(a.root, a.preset, a.seed, reporter=rep, workers=a.workers)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
