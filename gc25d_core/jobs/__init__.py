"""Thin torchrun entry points: ``python -m gc25d_core.jobs.<name> --config run.yaml``.

Each module parses arguments, opens the process group and the reporter, calls the core library and
closes. Errors on any rank are recorded by torch's elastic ``record`` so torchrun (and the Dagster
launcher) can show which rank failed and why.

A rank binds itself to its launching parent here, on the package's import and before any entry
module imports torch (seconds of start-up): a torchrun killed meanwhile takes its ranks with it
(``gc25d_core.parent_death``; Linux only).
"""

from gc25d_core.parent_death import die_with_parent

die_with_parent()
