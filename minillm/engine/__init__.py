"""Generation: the sampler, sequences with their own sampling state, and the decode loops (one
sequence, or many in shared batched steps)."""
