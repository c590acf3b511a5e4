"""Benchmarks: data sets, runners and metrics."""
