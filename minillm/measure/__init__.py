"""The machine's numbers: the figures of this machine and of published chips, the roofline, and
the measurements behind `minillm bench` (the meter that counts each step's bytes and FLOPs is
`minillm.meter`; BLAS threads are set with `minillm.threads`).

    probe         this machine: last-level cache, memory bandwidth, matmul peak, load and threads
    hardware      `machine()`: the measured figures, cached; what another chip would do
    chips         `CHIPS` (published chips), `Hardware`, `roofline`, `decode_ceiling`
    shapes        model shapes by name for the chip calculator (weights and KV bytes per token)
    experts       published mixtures' shapes, expert parallelism's arithmetic
    comparisons   the words for a comparison computed from the numbers beside it
    gpu           a GPU's measured figures (copy bandwidth, matmul peak, launch cost, decode steps)
    busy          is the machine busy? a one-line note before the first timing
    bench         decode against the memory ceiling per context length (`minillm bench`)
    batching      batched decode against the roofline (`bench --batch`)
    quantization  fewer bytes per weight: decode per weight format (`bench --weights`)
    speculation   speculative decoding per k and draft against plain decode (`bench --speculate`)
    contexts      a decode step's time and bytes against the context, interleaved (`bench --context-sweep`)
    residency     were the weights read from a cache or from DRAM? from the measurement, never sysfs
"""
