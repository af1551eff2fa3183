"""Small problem generators shared by the tests."""

import contextlib

import autograd.numpy as anp
import numpy as np

import refbayes as rb


def random_spd(rng, n, floor=0.3):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + floor * np.eye(n)


def linear_model(P, C):
    """y = H theta with the (C, P) matrix H passed, flattened, as the input x."""
    return rb.Function(lambda theta, x: anp.dot(anp.reshape(x, (C, P)), theta), n_params=P, out_dim=C, in_dim=C * P)


def linear_gaussian_stream(rng, T, C, P, R=None):
    """Random H_t (T, C, P), R (C, C) and y_t drawn from the model with a random theta."""
    Hs = rng.standard_normal((T, C, P))
    R = random_spd(rng, C) if R is None else R
    theta = rng.standard_normal(P)
    ys = np.einsum("tcp,p->tc", Hs, theta) + rng.multivariate_normal(np.zeros(C), R, size=T)
    return Hs, ys, R


def small_mlp(in_dim, hidden, out_dim, activation="tanh"):
    return rb.MLP([in_dim, hidden, out_dim], activation=activation)


def close(a, b, rtol=1e-10, floor=1.0):
    """max|a - b| <= rtol * max(floor, max|b|), and the same shapes (floor 1: relative to values of
    order one at least; a tiny floor: purely relative)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    err = np.max(np.abs(a - b), initial=0.0)
    scale = max(floor, np.max(np.abs(b), initial=0.0))
    assert err <= rtol * scale, f"max error {err:.3e} > {rtol:.1e} * {scale:.3e}"


def same_belief(out, ref, floor=1.0):
    """Same belief type and the same Gaussian (diagonal: mean, var; DLR: mean, ups, W W^T) to 1e-10."""
    from refbayes.beliefs import DLR

    assert type(out) is type(ref)
    close(out.mean, ref.mean, floor=floor)
    if isinstance(ref, DLR):
        assert out.W.shape == ref.W.shape
        close(out.ups, ref.ups, floor=floor)
        close(out.W @ out.W.T, ref.W @ ref.W.T, floor=floor)
    else:
        close(out.var, ref.var, floor=floor)


# Monte Carlo estimators on the compiled MLP path (tests/test_bong_mc_compiled.py and
# tests/test_bong_mc_hess_compiled.py): the same likelihoods, and the same run of both backends


def mc_likelihood(name):
    """The likelihoods of the compiled Monte Carlo tests (3 outputs): a full Gaussian R, a diagonal one
    with jitter (the gradient solves with R itself; the jitter only enters cov), and a categorical in
    both modes."""
    if name == "gaussian":
        return rb.Gaussian(np.array([[1.0, 0.2, 0.0], [0.2, 0.8, 0.1], [0.0, 0.1, 1.2]]))
    if name == "gaussian-diag-jitter":
        return rb.Gaussian(np.array([0.7, 1.1, 0.9]), jitter=0.3)
    if name == "categorical-full":
        return rb.Categorical(3, mode="full")
    return rb.Categorical(3)


@contextlib.contextmanager
def no_generic_estimate():
    """A context in which the general route's estimators raise: a compiled Monte Carlo step must not
    reach them."""
    import pytest

    from refbayes.filters.bong import estimators as est_mod

    def fail(*args, **kwargs):
        raise AssertionError("the general route ran")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(est_mod, "estimate", fail)
        mp.setattr(est_mod, "mc_hess", fail)
        yield


def mc_run_both(ref_f, fast_f, bel, X, Y, seed=1):
    """(reference, compiled) of scan, update alone and predict_update, each from a fresh Generator with
    the same seed; checks that every inner iteration of the compiled run was compiled
    (``compiled.mc_calls``), that it never reached the general route, and that both runs consumed
    their Generators alike."""
    from refbayes.filters.bong import compiled

    def runs(f):
        r1, r2, r3 = (np.random.default_rng(seed + k) for k in range(3))
        out, res = f.scan(bel, X, Y, rng=r1)
        upd = f.update(out, X[0], Y[0], rng=r2)
        pu = f.predict_update(out, X[1], Y[1], rng=r3)
        return (out, res.yhat, upd, pu), [r.random() for r in (r1, r2, r3)]

    ref, ref_next = runs(ref_f)
    n0 = compiled.mc_calls[0]
    with no_generic_estimate():
        out, out_next = runs(fast_f)
    assert compiled.mc_calls[0] - n0 == (len(X) + 2) * fast_f.n_iter  # every inner iteration compiled
    assert out_next == ref_next  # the Generators were consumed alike
    return ref, out
