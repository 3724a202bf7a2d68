"""gc25d model stack (DESIGN.md §2 ``models/``, SPEC §6).

    configs    DiTConfig (full 5B / tiny), CausalConfig (sink, window, RoPE cap)
    sem_cond   pooled one-hot of the semantic ids -> SemCondEncoder (``gc_sem_cond``)
    gcdit      GcDiT: DiffSynth WanModel + gc_sem_cond with its own TI2V forward
    causal     the one block-causal mask / eviction / RoPE-position rule, KV cache, rollout
    loading    Wan2.2-TI2V-5B shards (sha256 + registry key hash), load_gc_weights
    export     the 831-tensor bf16 export and its validating reader
    vae        the VAE interface: build_vae_for (the config's VAE, weights checked), encode, decode,
               streaming decode, z_dim; over DiffSynth's WanVideoVAE38 (+ a tiny variant for tests)
    vae_fit    the tiny VAE's fit, its file and how the builder finds it
    fast_decoder  a small causal decoder distilled from the VAE (deploy's ``--decoder fast``), its
               fit, file and record
    fp8        FP8 GEMMs for the DiT blocks' linear layers in deploy (torchao, optional extra)

Submodules are imported explicitly: ``gcdit``, ``causal`` (rollout), ``loading`` and ``vae`` import
DiffSynth (through ``gc25d_core.compat``), which takes several seconds; ``configs`` does not.
"""
