"""Errors raised by refbayes when a computation cannot go on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


@contextlib.contextmanager
def inner_iteration(k: int, n: int) -> Iterator[None]:
    """Inside, a NotPositiveDefiniteError or DivergenceError of inner iteration ``k`` (from 0) of ``n`` of
    a step is raised again as a new exception of its type whose message ends with "(inner iteration
    k + 1 of n)" (a DivergenceError keeps its ``quantity`` and ``step``); with n = 1 it passes unchanged.
    Every route of an iterated step (BLR and BBB with ``n_iter`` > 1: the reference's loop, the compiled
    loops and the one-call diagonal kernel) names the iteration this way."""
    try:
        yield
    except (NotPositiveDefiniteError, DivergenceError) as exc:
        if n == 1:
            raise
        suffix = f" (inner iteration {k + 1} of {n})"
        if isinstance(exc, DivergenceError):
            raise DivergenceError(f"{exc}{suffix}", quantity=exc.quantity, step=exc.step) from exc
        raise NotPositiveDefiniteError(f"{exc}{suffix}") from exc


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
