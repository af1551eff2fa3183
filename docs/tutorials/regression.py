"""Tutorial: online regression with a tanh MLP (LO-FI, FD-EKF and the full EKF).

A 1-16-1 tanh network learns y = sin(2x) + noise one observation at a time.
Each filter makes a one-step-ahead prediction before it sees y_t; we report the
mean squared error of those predictions over the second half of the stream and
the test error after the last step.

Run:  python docs/tutorials/regression.py
"""

import numpy as np

import refbayes as rb

rng = np.random.default_rng(0)
T = 300
X = rng.uniform(-2, 2, size=(T, 1))
Y = np.sin(2 * X) + 0.1 * rng.standard_normal((T, 1))
X_test = np.linspace(-1.8, 1.8, 50)[:, None]
Y_test = np.sin(2 * X_test)

model = rb.MLP([1, 16, 1], activation="tanh")
lik = rb.Gaussian(obs_var=0.01)
theta0 = model.init_params(np.random.default_rng(1))
baseline = float(np.mean((Y_test - Y_test.mean()) ** 2))  # error of the best constant

# (filter, the test MSE it must beat as a fraction of the constant predictor's).
# The diagonal FD-EKF ignores correlations between weights and learns more slowly
# from one pass; LO-FI keeps the top 5 directions and is close to the full EKF.
filters = {
    "LO-FI (rank 5)": (rb.LoFi(model, lik, rank=5), 0.05),
    "FD-EKF": (rb.FDEKF(model, lik), 0.5),
    "full EKF": (rb.FullEKF(model, lik), 0.05),
}
for name, (filt, fraction) in filters.items():
    bel = filt.init(theta0, prior_var=1.0)
    sq_err = []
    for t in range(T):
        # one-step-ahead prediction from the current belief, then one filtering step
        yhat, _ = filt.predict_obs(bel, X[t], method="plugin")
        sq_err.append(float(np.sum((yhat - Y[t]) ** 2)))
        bel = filt.predict_update(bel, X[t], Y[t])
    test_mean, _ = filt.predict_obs(bel, X_test, method="plugin")
    test_mse = float(np.mean((test_mean - Y_test) ** 2))
    online = float(np.mean(sq_err[T // 2:]))
    print(f"{name:15s} online MSE (2nd half) {online:.4f}   test MSE {test_mse:.4f}   "
          f"(constant predictor {baseline:.4f})")
    # the network has learned the curve: better than the best constant by the stated factor
    assert test_mse < fraction * baseline, (name, test_mse, baseline)
    assert online < baseline, (name, online, baseline)
