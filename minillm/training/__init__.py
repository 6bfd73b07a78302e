"""Training: a hand-written backward pass, AdamW, and the loop that made the bundled model."""
