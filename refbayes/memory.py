"""Memory known before it is spent: a belief's size checked against the memory available.

A filter whose belief grows as P^2 (the full-covariance EKF, BONG over the full families)
checks, when it is built, that the belief and the step's working arrays fit in the memory
the machine has free, and otherwise raises :class:`refbayes.errors.InsufficientMemoryError`
naming the size, the method's memory formula and the structured filters that would fit.
Nothing is allocated before the check.

``REFBAYES_MEMORY_LIMIT`` (bytes, e.g. ``8e9``) replaces the memory the operating system
reports as available; ``0`` switches the check off.
"""

from __future__ import annotations

import os

__all__ = ["available_bytes", "require", "format_bytes", "structured_alternatives"]

FLOAT = 8  # bytes per float64


def available_bytes() -> float | None:
    """Memory available to a new allocation, in bytes (None when it cannot be told).

    ``REFBAYES_MEMORY_LIMIT`` if set; else Linux's MemAvailable (/proc/meminfo); else the
    free physical pages the C library reports.
    """
    env = os.environ.get("REFBAYES_MEMORY_LIMIT")
    if env:
        try:
            return float(env)
        except ValueError:
            raise ValueError(f"REFBAYES_MEMORY_LIMIT must be a number of bytes; got {env!r}") from None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. 7.4 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024.0 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0


def structured_alternatives(P: int, C: int = 1, rank: int = 10) -> list[tuple[str, int]]:
    """What the structured filters need at P parameters: a readable list of (filter, bytes)."""
    return [
        (f"LoFi(rank={rank})", FLOAT * P * (rank + 2 + C)),
        ("VDEKF / FDEKF", FLOAT * P * (2 + C)),
        (f"Bong(family='dlr', rank={rank})", FLOAT * P * (rank + 2 + C)),
    ]


def require(what: str, n_floats: float, formula: str, P: int, C: int = 1) -> None:
    """Raise InsufficientMemoryError unless ``n_floats`` float64 numbers fit in available memory.

    what: the filter, as the user wrote it (e.g. "FullEKF"); formula: its memory in words
    (e.g. "P x P covariance + C x P Jacobian"); P, C: sizes, for the message and the
    structured alternatives. The check itself allocates nothing.
    """
    from .errors import InsufficientMemoryError

    need = FLOAT * float(n_floats)
    avail = available_bytes()
    if avail is None or avail == 0:
        return
    if need > avail:
        alts = "; ".join(f"{name} needs {format_bytes(b)}" for name, b in structured_alternatives(P, C))
        raise InsufficientMemoryError(
            f"{what} stores {formula} = {format_bytes(need)} at P = {P:,}, more than the "
            f"{format_bytes(avail)} available; {alts}", needed=need, available=avail)
