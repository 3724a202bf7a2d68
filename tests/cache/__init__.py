"""Training-cache tests (gc25d_core.cache)."""
