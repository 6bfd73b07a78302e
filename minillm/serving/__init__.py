"""Serving: the engine under a workload and behind an HTTP server, and the numbers a serving
benchmark reports.

    workloads  who asks for what, and when: seeded generators and a JSONL trace format
    metrics    a run's numbers (throughput, TTFT, TBT, TPOT, goodput, KV waste, phases) from the
               engine's requests and steps; `engine_for`/`serve` run a workload (serve-sim)
    disagg     prefill/decode disaggregation: two engines on their own threads and clocks, the KV
               handed over a simulated link (`Engine.adopt` on the decode side)
    rates      `serve-sim --rates`: a sweep of arrival rates and the highest one within a target
    engines    what `monitor` and `loadgen` know of other servers (llama.cpp, vLLM): their metrics'
               names and what each counter measures
    loop       `minillm serve`'s engine thread: requests in, tokens and Prometheus counts out
    api        the OpenAI completions API: parse and check a request, build the replies
    chat_api   POST /v1/chat/completions on top of the completions machinery
    http       the HTTP side: the routes, admission (read, render, submit) and shutdown, on uvicorn
    guard      the checks every request passes first: method, sizes, Host, Origin, API key, JSON
    stream     the streaming bridge: the engine thread's events to text, a reply or SSE chunks
    renders    which chat renders next: dead work dropped, bounded waiting, a per-client share, a breaker
    protocol   uvicorn's h11 protocol with the connection cap, timeouts, JSON parser errors, shutdown
    prom       the metrics in Prometheus's text format (each series and its help declared once)
    loadgen    `minillm loadgen`: an open-loop load generator for any OpenAI-compatible server
"""
