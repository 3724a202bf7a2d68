"""The gc25d code location: everything under gc25d_pipeline/defs, merged."""

import warnings
from pathlib import Path

import dagster as dg

# Dagster's own Pipes code reads its preview property PipesMessageReader.expected_writer_count in
# every session (dagster/_core/pipes/context.py), so every launch of a job would print this warning
# about code that is not ours. Only that warning, from that module, is ignored.
warnings.filterwarnings(
    "ignore",
    message=r"Function `PipesMessageReader\.expected_writer_count` is currently in preview",
    category=dg.PreviewWarning,
    module=r"dagster\._core\.pipes\.context",
)

# the defs module named by pyproject.toml's [tool.dg.project] (gc25d_pipeline.defs), every module in it
defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
