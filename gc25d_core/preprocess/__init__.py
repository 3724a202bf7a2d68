"""SPEC §5 preprocessing: per-clip builders (cond, meta, cond_ext, extension canvas, latents), the
tiny VAE's fit, and the sharded, resumable runner that the torchrun jobs share. It runs the VAE
(models/), so it sits beside train / eval / deploy in the layering, not below models."""
