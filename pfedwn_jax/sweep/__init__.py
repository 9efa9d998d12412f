"""Sweeps: many runs of one experiment in one compiled program (see docs/sweeps.md)."""
