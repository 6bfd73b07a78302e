"""Serving: workloads, their metrics and the simulator (serve-sim); an OpenAI-compatible HTTP server
on the engine loop, its Prometheus metrics, and a load generator to diagnose it with."""
