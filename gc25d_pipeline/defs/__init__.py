"""Definitions are auto-loaded from the modules of this package (dagster.load_from_defs_folder, gc25d_pipeline.definitions)."""
