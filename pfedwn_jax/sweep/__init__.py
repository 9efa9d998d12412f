"""Sweeps: many runs of an experiment in one compiled program (see docs/memory.md)."""
