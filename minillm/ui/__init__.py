"""What the terminal shows.

    report  number formatting (`fmt_bytes`, `fmt_flops`, `fmt_time`), the counters' tables, and the
            plain-words verdicts computed from the numbers beside them (the roofline's, and
            serve-sim's: which budget a figure favours, which phase took the time, the split's trade)
    live    the live view of a running engine: sequences, the KV block map, the queue, stalls
"""
