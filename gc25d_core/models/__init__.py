"""gc25d model stack (DESIGN.md §2 ``models/``, SPEC §6).

    configs    DiTConfig (full 5B / tiny), CausalConfig (sink, window, RoPE cap)
    sem_cond   pooled one-hot of the semantic ids -> SemCondEncoder (``gc_sem_cond``)
    gcdit      GcDiT: DiffSynth WanModel + gc_sem_cond with its own TI2V forward
    causal     the one block-causal mask / eviction / RoPE-position rule, KV cache, rollout
    loading    Wan2.2-TI2V-5B shards (sha256 + registry key hash), load_gc_weights
    export     the 831-tensor bf16 export and its validating reader
    vae        WanVideoVAE38 wrapper (+ a tiny random variant of the same class for tests)

Submodules are imported explicitly: ``gcdit``, ``causal`` (rollout), ``loading`` and ``vae`` import
DiffSynth (through ``gc25d_core.compat``), which takes several seconds; ``configs`` does not.
"""
