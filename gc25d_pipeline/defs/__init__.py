"""Definitions are auto-loaded from the modules of this package (dagster.components.load_defs)."""
