"""KV caches: every layer's keys and values of the positions a sequence has run, so a decode step
computes only its new token.

    contiguous  `KVCache`: one [L, Hkv, n_ctx, hd] array per sequence, preallocated (lessons 1-7,
                `generate`); `CacheBase`, what both caches share
    paged       `PagedKVPool` (a shared pool of fixed-size blocks, reference-counted by
                `BlockAllocator`) and `PagedKVCache` (a sequence's block table into it): batches
                and serving; what every pool and cache answers (`state_blocks`, `states`; `state`)
    state       a fixed-size state per sequence (a hybrid's linear layers): `StatePool`, `State`, and
                the hybrid caches and pool that hold one beside the full layers' KV
"""
