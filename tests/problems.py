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
