"""Tutorial: online classification of handwritten digits (scikit-learn's load_digits).

A small subset (digits 0-4, 250 training images, 8x8 pixels scaled to [0, 1]) is
streamed once through an MLP with a Categorical likelihood, filtered by LO-FI and
by the VD-EKF. We print the test accuracy and the test negative log-likelihood of
the linearised predictive distribution.

Run:  python docs/tutorials/classification.py   (needs scikit-learn)
"""

import numpy as np
from sklearn.datasets import load_digits

import refbayes as rb

digits = load_digits()
keep = digits.target < 5
X_all = digits.data[keep] / 16.0
y_all = digits.target[keep]
rng = np.random.default_rng(0)
order = rng.permutation(len(y_all))
X_all, y_all = X_all[order], y_all[order]
X_train, y_train = X_all[:250], y_all[:250]
X_test, y_test = X_all[250:450], y_all[250:450]
K = 5

model = rb.MLP([64, 8, K], activation="tanh")
lik = rb.Categorical(K)  # labels are integers 0..K-1; the likelihood encodes them
theta0 = model.init_params(np.random.default_rng(1))

for name, filt in {"LO-FI (rank 10)": rb.LoFi(model, lik, rank=10),
                   "VD-EKF": rb.VDEKF(model, lik)}.items():
    bel = filt.init(theta0, prior_var=0.5)
    for x, y in zip(X_train, y_train):
        bel = filt.predict_update(bel, x, y)
    probs, _ = filt.predict_obs(bel, X_test, method="linearized")   # (N, K) class probabilities
    probs = np.clip(probs, 1e-12, 1.0)
    accuracy = float(np.mean(np.argmax(probs, axis=1) == y_test))
    nll = float(-np.mean(np.log(probs[np.arange(len(y_test)), y_test])))
    print(f"{name:16s} test accuracy {accuracy:.3f}   test NLL {nll:.3f}   (chance 0.2, NLL {np.log(K):.3f})")
    assert accuracy > 0.8, (name, accuracy)
    assert nll < 0.6 * np.log(K), (name, nll)
