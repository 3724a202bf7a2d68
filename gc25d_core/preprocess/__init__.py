"""SPEC §5 preprocessing: per-clip builders (cond, meta, cond_ext, extension canvas, latents) and the
sharded, resumable runner that the torchrun jobs share."""
