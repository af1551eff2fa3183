"""Errors raised by refbayes when a computation cannot go on."""

import numpy as np

__all__ = ["NotPositiveDefiniteError", "ConvergenceError", "DivergenceError", "UsageError"]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """A matrix (or variance) that must be positive definite is not.

    Raised instead of returning NaNs, e.g. when round-off makes a covariance
    indefinite. Subclasses ``numpy.linalg.LinAlgError`` so existing handlers
    keep working.
    """


class ConvergenceError(RuntimeError):
    """An iterative solver stopped before meeting its tolerance."""


class DivergenceError(ArithmeticError):
    """A filter's state has run away: the model output at the current mean is not finite.

    The belief itself is finite (beliefs never hold NaN or inf), but its mean has
    grown so large that the network overflows. Usually a too-large prior variance,
    learning rate or a mean rule that overshoots.
    """


class UsageError(ValueError):
    """A command-line argument that parses but names nothing valid (``refbayes`` exits with status 2, no traceback)."""
