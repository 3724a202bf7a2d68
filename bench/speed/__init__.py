"""How fast our code runs: training steps and MFU, attention kernels, the deploy cell, latents, the
cache consumer, the CPU jobs (run each as ``python -m bench.speed.<name>`` from the repository root)."""
