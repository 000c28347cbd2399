"""Benchmarks: ``pipeline`` simulates sync vs async RL on PolyTrace-shaped traces (``traces``)."""
