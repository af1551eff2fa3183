"""Tutorial: cross-checking refbayes against an independent implementation.

We write a tiny dense extended Kalman filter here, with nothing from refbayes but
the model's forward pass, and a finite-difference Jacobian of our own. Then we run
it next to ``rb.FullEKF`` step by step on the same stream and compare the means
and covariances after every step. Agreement to ~1e-6 (limited by the finite
differences) says both compute the same EKF equations (Chang, Jones & Murphy 2022,
eqs 4-9).

Run:  python docs/tutorials/cross_check.py
"""

import numpy as np

import refbayes as rb

rng = np.random.default_rng(0)
model = rb.MLP([2, 5, 1], activation="tanh")
obs_var, gamma, q = 0.05, 0.999, 1e-4
lik = rb.Gaussian(obs_var=obs_var)
filt = rb.FullEKF(model, lik, gamma=gamma, q=q)

P = model.n_params
theta0 = model.init_params(np.random.default_rng(1))
X = rng.normal(size=(40, 2))
Y = np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(40, 1))


def f(theta, x):
    return np.atleast_1d(model.apply(theta, x))


def jac_fd(theta, x, h=1e-6):
    """Central finite-difference Jacobian (1, P) of the network output."""
    J = np.empty((1, P))
    for i in range(P):
        e = np.zeros(P)
        e[i] = h
        J[:, i] = (f(theta + e, x) - f(theta - e, x)) / (2 * h)
    return J


def dense_ekf_step(mu, Sigma, x, y):
    """One predict + update of the textbook EKF in covariance form."""
    mu = gamma * mu
    Sigma = gamma**2 * Sigma + q * np.eye(P)
    H = jac_fd(mu, x)
    S = H @ Sigma @ H.T + obs_var * np.eye(1)
    K = np.linalg.solve(S, H @ Sigma).T
    mu = mu + K @ (y - f(mu, x))
    Sigma = Sigma - K @ S @ K.T
    return mu, 0.5 * (Sigma + Sigma.T)


bel = filt.init(theta0, prior_var=0.5)
mu, Sigma = theta0.copy(), 0.5 * np.eye(P)
worst_mean = worst_cov = 0.0
for t in range(len(X)):
    bel = filt.predict_update(bel, X[t], Y[t])
    mu, Sigma = dense_ekf_step(mu, Sigma, X[t], Y[t])
    worst_mean = max(worst_mean, float(np.max(np.abs(bel.mean - mu))))
    worst_cov = max(worst_cov, float(np.max(np.abs(bel.cov - Sigma))))

print(f"P = {P}, T = {len(X)} steps")
print(f"largest |mean difference|       over all steps: {worst_mean:.2e}")
print(f"largest |covariance difference| over all steps: {worst_cov:.2e}")
assert worst_mean < 1e-6 and worst_cov < 1e-6, (worst_mean, worst_cov)
# and the comparison is not vacuous: the filter moved far from the prior
assert np.max(np.abs(bel.mean - theta0)) > 1e-2
