"""Small problem generators shared by the tests."""

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
