"""Facts about the machine or the data that set a design choice: NCCL bandwidth, VAE precision options,
the SPEC's masking and extension-canvas statistics on the code world (``python -m bench.probes.<name>``
from the repository root)."""
