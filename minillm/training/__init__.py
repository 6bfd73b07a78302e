"""Training: a hand-written backward pass, AdamW, and the loop that made the bundled model.

    ops    each operation's forward and backward, side by side (as in llm.c)
    model  the GPT-2 being trained: initialisation, forward and backward of the whole network
    optim  AdamW, gradient-norm clipping and the learning-rate schedule
    data   the training text and the held-out loss
    train  the loop
"""
