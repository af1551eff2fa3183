"""Errors raised by refbayes when a computation cannot go on."""

import numpy as np

__all__ = ["NotPositiveDefiniteError", "ConvergenceError"]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """A matrix (or variance) that must be positive definite is not.

    Raised instead of returning NaNs, e.g. when round-off makes a covariance
    indefinite. Subclasses ``numpy.linalg.LinAlgError`` so existing handlers
    keep working.
    """


class ConvergenceError(RuntimeError):
    """An iterative solver stopped before meeting its tolerance."""
