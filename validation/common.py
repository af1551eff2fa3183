"""Data sets and metrics shared by the validation runs (no downloads)."""

import os

import numpy as np
from scipy.special import log_softmax, softmax

__all__ = ["digits", "split", "class_metrics", "plugin_metrics", "mc_metrics", "plugin_logits", "mc_probs", "savefig", "check", "sgd_pass"]


def digits():
    """scikit-learn's bundled 8x8 digits: X (1797, 64) scaled to [0, 1], y (1797,) in 0..9."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data / 16.0, data.target.astype(int)


def split(X, y, n_train, rng):
    """Stratified random split into (X_train, y_train, X_test, y_test)."""
    from sklearn.model_selection import train_test_split

    seed = int(rng.integers(2**31 - 1))
    Xtr, Xte, ytr, yte = train_test_split(X, y, train_size=n_train, stratify=y, random_state=seed)
    return Xtr, ytr, Xte, yte


def plugin_logits(model, theta, X):
    return model.apply_batch(theta, X)


def class_metrics(log_probs, y):
    """(mean NLL, error rate) from log class probabilities (N, K) and labels (N,)."""
    nll = -log_probs[np.arange(len(y)), y].mean()
    err = float(np.mean(log_probs.argmax(1) != y))
    return float(nll), err


def plugin_metrics(model, theta, X, y):
    return class_metrics(log_softmax(plugin_logits(model, theta, X), axis=1), y)


def mc_probs(model, bel, X, rng, n_samples):
    """Monte Carlo predictive class probabilities (N, K): average softmax over theta ~ belief."""
    thetas = bel.sample(rng, n_samples)
    return np.mean([softmax(model.apply_batch(th, X), axis=1) for th in thetas], axis=0)


def mc_metrics(model, bel, X, y, rng, n_samples):
    return class_metrics(np.log(np.maximum(mc_probs(model, bel, X, rng, n_samples), 1e-300)), y)


def sgd_pass(model, likelihood, theta, X, Y, lr, momentum=0.0, callback=None):
    """One pass of SGD with momentum on -log p(y | x, theta), batch size 1."""
    theta = np.array(theta, dtype=float)
    vel = np.zeros_like(theta)
    for t, (x, y) in enumerate(zip(X, Y)):
        eta, J = model.value_and_jacobian(theta, x)
        grad = -J.T @ likelihood.grad(y, eta)
        vel = momentum * vel - lr * grad
        theta = theta + vel
        if callback is not None:
            callback(t, theta)
    return theta


def savefig(fig, outdir, name):
    path = os.path.join(outdir, name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


def check(name, expected, measured, passed):
    return {"name": name, "expected": expected, "measured": measured, "passed": bool(passed)}
