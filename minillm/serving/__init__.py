"""Serving in miniature: workloads, their metrics, and what serve-sim shows."""
