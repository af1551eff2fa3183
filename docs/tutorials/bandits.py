"""Tutorial: a small contextual bandit with the subspace EKF (Duran-Martin, Kara & Murphy 2022).

The digits 0-4 of scikit-learn's load_digits become a 5-armed bandit: the
context is an image, the arm a class, the reward 1 when the arm is the label.
We compare Thompson sampling with an EKF on a 20-dimensional subspace of a
small MLP, linear Thompson sampling, and uniformly random arms, over 500 steps.

Run:  python docs/tutorials/bandits.py   (needs scikit-learn)
"""

import numpy as np
from sklearn.datasets import load_digits

import refbayes as rb

digits = load_digits()
keep = digits.target < 5
X, labels = digits.data[keep], digits.target[keep]
env = rb.bandits.classification_bandit(X, labels, np.random.default_rng(0), n_steps=500)
n_arms = 5

network = rb.MLP([env.n_features, 16, n_arms], activation="relu")   # one output head per arm
agents = {
    "subspace EKF": rb.bandits.SubspaceAgent(network, d=20, n_warmup_steps=200, obs_var=0.01, prior_var=0.01),
    "linear TS": rb.bandits.LinearTSAgent(),
    "random": rb.bandits.RandomAgent(),
}
rewards = {}
for name, agent in agents.items():
    res = rb.bandits.run_bandit(env, agent, np.random.default_rng(1), n_warmup_per_arm=10)
    rewards[name] = res.total_reward
    print(f"{name:13s} total reward {res.total_reward:6.1f} / {env.n_steps}   regret {res.total_regret:6.1f}")

# chance is about T / 5; over 500 steps the learning agents are well above it,
# and the network in a subspace beats the per-arm linear models on raw pixels
assert rewards["random"] < 0.35 * env.n_steps, rewards
assert rewards["subspace EKF"] > 0.5 * env.n_steps, rewards
assert rewards["linear TS"] > 0.3 * env.n_steps, rewards
