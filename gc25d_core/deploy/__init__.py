"""The live deploy session (DESIGN.md §2 ``deploy/``): code world -> ids + prompt -> 4-step sampler
+ commit -> streaming VAE decode. ``world`` (the inference-time code world), ``runtime`` (export,
text, VAE, one cell at a time), ``session`` (the two together), ``export`` (the deploy export
file), ``cli`` (``python -m gc25d_core.deploy``) and ``web`` (the local page)."""
