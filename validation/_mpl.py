"""Lazy access to matplotlib for the validation plots.

Importing a validation module never imports matplotlib nor changes its backend.
A plotting function calls :func:`pyplot` when it draws: that selects the
non-interactive ``Agg`` backend only when the user has not chosen one (no
``MPLBACKEND`` environment variable, no ``matplotlib.use`` call, no backend in a
matplotlibrc), then returns ``matplotlib.pyplot``.
"""


def pyplot():
    """Return ``matplotlib.pyplot``, selecting ``Agg`` only if no backend was chosen."""
    import os

    import matplotlib
    from matplotlib import rcsetup

    chosen = dict.__getitem__(matplotlib.rcParams, "backend")
    if not os.environ.get("MPLBACKEND") and chosen is getattr(rcsetup, "_auto_backend_sentinel", None):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
