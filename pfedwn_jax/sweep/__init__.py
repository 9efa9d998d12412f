"""Sweeps: many runs of one experiment (seeds x a grid of values) as one unit of work."""
