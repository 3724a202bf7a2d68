"""Thin torchrun entry points: ``python -m gc25d_core.jobs.<name> --config run.yaml``.

Each module parses arguments, opens the process group and the reporter, calls the core library and
closes. Errors on any rank are recorded by torch's elastic ``record`` so torchrun (and the Dagster
launcher) can show which rank failed and why.
"""
