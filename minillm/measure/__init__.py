"""The machine's numbers: the meter (bytes and FLOPs per step), the hardware figures (bandwidth,
peak, presets for known chips, the roofline) and the benchmark."""
