"""The gc25d code location: everything under gc25d_pipeline/defs, merged."""

import warnings

import dagster as dg
from dagster.components import load_defs

import gc25d_pipeline.defs

# Every Pipes session warns about the preview expected_writer_count API; it is noise for us.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", category=dg.BetaWarning)

defs = load_defs(gc25d_pipeline.defs)
