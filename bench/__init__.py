"""Benchmarks against the anchors, competitors side by side in one run (see docs/benchmarks.md)."""
