"""Errors raised by refbayes when a computation cannot go on."""

from __future__ import annotations

import numpy as np

__all__ = ["NotPositiveDefiniteError", "ConvergenceError", "DivergenceError", "InsufficientMemoryError", "UsageError"]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """A matrix (or variance) that must be positive definite is not.

    Raised instead of returning NaNs, e.g. when round-off makes a covariance
    indefinite. Subclasses ``numpy.linalg.LinAlgError`` so existing handlers
    keep working.
    """


def r_not_positive_definite(R: np.ndarray | None = None) -> NotPositiveDefiniteError:
    """The error for an observation covariance R (C, C) that a non-singular update cannot factor: one
    message for every backend. Where R has a variance <= 0 on its diagonal (what a likelihood gives
    when a probability saturates to 0 or 1, or a rate exp(eta) underflows to 0), the message says so
    and names the remedies, instead of suggesting a singular covariance alone."""
    msg = "R is not positive definite"
    if R is not None:
        d = np.diagonal(np.asarray(R, dtype=np.float64))
        if d.size and not np.all(d > 0):
            c = int(np.argmin(d))
            msg += (f": variance {float(d[c])!r} for output {c} (a likelihood's R has this when a probability "
                    "saturates to 0 or 1 or a rate exp(eta) underflows to 0; a jitter > 0 on the likelihood, "
                    "Bernoulli's prob_clip or a smaller prior variance keeps R positive definite)")
    return NotPositiveDefiniteError(msg + "; use singular=True for a singular covariance")


class ConvergenceError(RuntimeError):
    """An iterative solver stopped before meeting its tolerance."""


class DivergenceError(ArithmeticError):
    """A filter's state has run away: a quantity that must be finite is not.

    Raised at the step where it happens, naming the quantity: the model output or its
    Jacobian at the current mean, the likelihood's mean, covariance or natural parameter
    (e.g. exp(eta) overflowing for a Poisson rate), or the new belief's mean or variances.
    The caller's belief is left as it was. Usually a too-large prior variance, learning
    rate or observation, or a mean rule that overshoots.

    Attributes: ``quantity`` (str or None), the quantity that left the finite range;
    ``step`` (int or None), the index of the observation in ``scan`` where it happened.
    """

    def __init__(self, message: str, *, quantity: str | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.quantity = quantity
        self.step = step

    def at_step(self, step: int) -> DivergenceError:
        """This error with the scan step ``step`` named in its message (a new exception)."""
        if self.step is not None:
            return self
        out = DivergenceError(f"step {step}: {self}", quantity=self.quantity, step=step)
        out.__cause__ = self.__cause__
        return out


def at_inner_iteration(exc: Exception, k: int, n: int) -> Exception:
    """``exc`` (a NotPositiveDefiniteError or DivergenceError raised in inner iteration ``k`` of ``n`` of a
    step, k from 1) as a new exception of the same type whose message ends with "(inner iteration k of n)";
    a DivergenceError keeps its ``quantity`` and ``step``. Every backend of an iterated step (BLR and BBB,
    ``n_iter`` > 1) names the iteration this way (callers raise it ``from exc``). Other exceptions are
    returned as they are."""
    if isinstance(exc, DivergenceError):
        out: Exception = DivergenceError(f"{exc} (inner iteration {k} of {n})", quantity=exc.quantity, step=exc.step)
    elif isinstance(exc, NotPositiveDefiniteError):
        out = NotPositiveDefiniteError(f"{exc} (inner iteration {k} of {n})")
    else:
        return exc
    return out


class InsufficientMemoryError(MemoryError):
    """A belief (or a step's working arrays) would not fit in the memory available.

    Raised when a filter is built, before anything is allocated. Attributes: ``needed`` and
    ``available``, in bytes.
    """

    def __init__(self, message: str, *, needed: int | None = None, available: int | None = None) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class UsageError(ValueError):
    """A command-line argument that parses but names nothing valid (``refbayes`` exits with status 2, no traceback)."""
