"""gc25d Dagster code location: thin assets over gc25d_core, heavy ones launched through torchrun."""
