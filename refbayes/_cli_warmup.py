"""``refbayes warmup``: compile (and cache) the numba kernels ahead of first use (docs/threads.md)."""

__all__ = ["add_arguments", "run"]


def add_arguments(parser, name):
    """Options of ``refbayes warmup``."""
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")


def run(args):
    """Run a few steps of every numba-backed filter on a tiny MLP, so that the kernels compile now."""
    import time

    import numpy as np

    import refbayes as rb

    rng = np.random.default_rng(0)
    model = rb.MLP([3, 4, 2])
    X, Y = rng.normal(size=(3, 3)), rng.normal(size=(3, 2))
    makers = {
        "LoFi": lambda: rb.LoFi(model, rb.Gaussian(0.2), rank=2, backend="numba"),
        "FDEKF": lambda: rb.FDEKF(model, rb.Gaussian(0.2), backend="numba"),
        "VDEKF": lambda: rb.VDEKF(model, rb.Gaussian(0.2), backend="numba"),
    }
    for name, make in makers.items():
        t0 = time.perf_counter()
        f = make()
        bel = f.init(rng.normal(size=model.n_params) * 0.1)
        bel = f.predict_update(bel, X[0], Y[0])
        f.scan(bel, X, Y)
        if not args.quiet:
            print(f"refbayes warmup: {name} kernels ready ({time.perf_counter() - t0:.1f} s)")
    return 0
