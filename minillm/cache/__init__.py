"""KV caches: `contiguous` (one [L, H, n_ctx, hd] array per sequence, used by lessons 1-7) and `paged`
(a shared pool of fixed-size blocks with a block table per sequence, used for batches and serving)."""
