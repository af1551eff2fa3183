"""Recursive Gaussian filters: one module per family, pure functions plus thin classes."""
