"""Contextual bandit environments on offline data (Duran-Martin et al. 2022, section 4).

An environment is a fixed table: contexts s_t (T, N_s), the reward each arm
would give, ``rewards`` (T, N_a), and the expected rewards ``mean_rewards``
(T, N_a) used for the regret. Only the pulled arm's reward is revealed to an
agent. Every constructor is deterministic given its ``np.random.Generator``.

- classification_bandit: arms are classes, reward 1[a = label] (section 4.1);
- sklearn_bandit: the same on data sets shipped with scikit-learn (optional
  dependency, imported when called);
- wheel_bandit: the synthetic wheel problem of Riquelme, Tucker & Snoek (2018);
- ratings_bandit: a MovieLens-style simulator built from a rank-K SVD of a
  sparse ratings matrix (section 4.2), here a synthetic matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._validate import as_float_array, int_at_least, positive_int, positive_scalar

__all__ = [
    "BanditEnvironment",
    "Warmup",
    "classification_bandit",
    "sklearn_bandit",
    "wheel_bandit",
    "ratings_bandit",
    "SKLEARN_DATASETS",
]

SKLEARN_DATASETS = ("digits", "wine", "breast_cancer", "iris", "synthetic", "synthetic_imbalanced")


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _frozen(a):
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


class _ContextRows:
    """The sizes of a ``contexts`` table (T, N_s), shared by the warm-up data and the environment."""

    contexts: np.ndarray

    @property
    def n_steps(self) -> int:
        """T, the number of rows (time steps) of ``contexts``."""
        return self.contexts.shape[0]

    @property
    def n_features(self) -> int:
        """N_s, the context dimension."""
        return self.contexts.shape[1]


@dataclass(frozen=True, eq=False)
class Warmup(_ContextRows):
    """Warm-up data D_tau: arms pulled round-robin, a_i = i mod N_a.

    contexts (T_w, N_s); actions (T_w,) int; rewards (T_w,) observed;
    full_rewards (T_w, N_a) every arm's reward (counterfactual; only for
    agents that opt into full-information warm-up); n_arms.
    """

    contexts: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    full_rewards: np.ndarray
    n_arms: int


@dataclass(frozen=True, eq=False)
class BanditEnvironment(_ContextRows):
    """A fixed contextual bandit: contexts (T, N_s), rewards (T, N_a), mean_rewards (T, N_a)."""

    contexts: np.ndarray
    rewards: np.ndarray
    mean_rewards: np.ndarray
    name: str = "bandit"

    def __post_init__(self):
        S = as_float_array(self.contexts, "contexts", ndim=2)
        T = S.shape[0]
        R = as_float_array(self.rewards, "rewards", shape=(T, None))
        M = as_float_array(self.mean_rewards, "mean_rewards", shape=R.shape)
        if T < 1 or R.shape[1] < 2:
            raise ValueError(f"a bandit needs T >= 1 and at least 2 arms; got rewards of shape {R.shape}")
        object.__setattr__(self, "contexts", _frozen(S))
        object.__setattr__(self, "rewards", _frozen(R))
        object.__setattr__(self, "mean_rewards", _frozen(M))

    @property
    def n_arms(self) -> int:
        """N_a."""
        return self.rewards.shape[1]

    def _t(self, t):
        t = int_at_least(t, "t", 0)
        if t >= self.n_steps:
            raise ValueError(f"t must be < T = {self.n_steps}; got {t}")
        return t

    def _a(self, a):
        a = int_at_least(a, "action", 0)
        if a >= self.n_arms:
            raise ValueError(f"action must be < n_arms = {self.n_arms}; got {a}")
        return a

    def reward(self, t: int, a: int) -> float:
        """Observed reward of arm a at step t."""
        return float(self.rewards[self._t(t), self._a(a)])

    def regret(self, t: int, a: int) -> float:
        """Expected regret max_b E[r_t,b] - E[r_t,a] of arm a at step t."""
        t = self._t(t)
        return float(self.mean_rewards[t].max() - self.mean_rewards[t, self._a(a)])

    def best_actions(self) -> NDArray[np.intp]:
        """argmax of the expected rewards at every step (lowest index on ties): (T,)."""
        return np.argmax(self.mean_rewards, axis=1)

    def warmup(self, n_per_arm: int) -> Warmup:
        """The first N_a * n_per_arm steps with arms pulled round-robin (Algorithm 1, line 1)."""
        n = int_at_least(n_per_arm, "n_per_arm", 0) * self.n_arms
        if n >= self.n_steps:
            raise ValueError(f"warm-up of {n} steps leaves no online step (T = {self.n_steps})")
        actions = np.arange(n) % self.n_arms
        return Warmup(
            _frozen(self.contexts[:n]),
            _frozen(actions),
            _frozen(self.rewards[np.arange(n), actions]),
            _frozen(self.rewards[:n]),
            self.n_arms,
        )


def _standardize(X):
    mu = X.mean(axis=0)
    sd = X.std(axis=0)
    sd[sd == 0] = 1.0
    return (X - mu) / sd


def classification_bandit(X: ArrayLike, labels: ArrayLike, rng: np.random.Generator, n_steps: int | None = None,
                          replace: bool = False, standardize: bool = True, add_bias: bool = True,
                          n_classes: int | None = None, name: str = "classification") -> BanditEnvironment:
    """Turn a labelled data set into a bandit: one arm per class, reward 1[a = label] (section 4.1).

    X (N, N_s), labels (N,) integers in [0, K). Rows are shuffled once with
    ``rng``: a permutation (``replace=False``, n_steps <= N) or n_steps draws
    with replacement. ``standardize`` z-scores each feature (a zero s.d. is
    replaced by 1); ``add_bias`` prepends a constant-1 column.
    """
    _check_rng(rng)
    X = as_float_array(X, "X", ndim=2)
    labels = np.asarray(labels)
    if labels.shape != (X.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be {X.shape[0]} integers; got shape {labels.shape}, dtype {labels.dtype}")
    K = int(labels.max()) + 1 if n_classes is None else int_at_least(n_classes, "n_classes", 2)
    if labels.min() < 0 or labels.max() >= K:
        raise ValueError(f"labels must be in [0, {K}); got range [{labels.min()}, {labels.max()}]")
    if K < 2:
        raise ValueError("labels must contain at least 2 classes")
    N = X.shape[0]
    T = N if n_steps is None else positive_int(n_steps, "n_steps")
    if not replace and T > N:
        raise ValueError(f"n_steps must be <= {N} without replacement; got {T}")
    idx = rng.choice(N, size=T, replace=True) if replace else rng.permutation(N)[:T]
    S = X[idx]
    if standardize:
        S = _standardize(S)
    if add_bias:
        S = np.concatenate([np.ones((T, 1)), S], axis=1)
    R = np.zeros((T, K))
    R[np.arange(T), labels[idx]] = 1.0
    return BanditEnvironment(S, R, R, name)


def sklearn_bandit(name: str, rng: np.random.Generator, n_steps: int | None = None, replace: bool | None = None,
                   standardize: bool | None = None, add_bias: bool = True) -> BanditEnvironment:
    """Classification bandits from data shipped with scikit-learn (imported lazily).

    name: "digits" (10 arms; features divided by 16 and not z-scored, as MNIST
    pixels are divided by 255 in section 4.3), "wine" (3), "breast_cancer" (2), "iris" (3), "synthetic"
    (make_classification, 54 features, 20 informative, 7 classes, Covertype
    stand-in) or "synthetic_imbalanced" (the same with class weights close to
    Shuttle's, 79% majority). ``replace`` defaults to sampling with
    replacement only when n_steps exceeds the data size.
    """
    if name not in SKLEARN_DATASETS:
        raise ValueError(f"name must be one of {SKLEARN_DATASETS}; got {name!r}")
    _check_rng(rng)
    try:
        import sklearn.datasets as skd
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("sklearn_bandit needs scikit-learn (pip install 'refbayes[validation]')") from exc
    if name.startswith("synthetic"):
        weights = None
        if name == "synthetic_imbalanced":
            weights = [0.79, 0.15, 0.035, 0.015, 0.005, 0.003, 0.002]
        n = 5000 if n_steps is None else positive_int(n_steps, "n_steps")
        X, y = skd.make_classification(n_samples=n, n_features=54, n_informative=20, n_redundant=10, n_classes=7,
                                       n_clusters_per_class=1, weights=weights,
                                       random_state=int(rng.integers(2**31 - 1)))
        K = 7
    else:
        loader = {"digits": skd.load_digits, "wine": skd.load_wine, "breast_cancer": skd.load_breast_cancer,
                  "iris": skd.load_iris}[name]
        X, y = loader(return_X_y=True)
        K = int(y.max()) + 1
        if name == "digits":
            X = X / 16.0
    if standardize is None:
        standardize = name != "digits"
    N = X.shape[0]
    if replace is None:
        replace = n_steps is not None and n_steps > N
    return classification_bandit(X, y.astype(np.int64), rng, n_steps=n_steps, replace=replace,
                                 standardize=standardize, add_bias=add_bias, n_classes=K, name=name)


def wheel_bandit(n_steps: int, rng: np.random.Generator, delta: float = 0.5,
                 mean_rewards: Sequence[float] = (1.2, 1.0, 50.0), noise_sd: float = 0.01) -> BanditEnvironment:
    """The wheel bandit (Riquelme, Tucker & Snoek 2018, section 5): 5 arms, contexts uniform in the unit disc.

    Arm 0 always has mean mu_1; inside the disc of radius ``delta`` arms 1-4
    have mean mu_2; outside it, the arm of the context's quadrant
    (1: x>0,y>0; 2: x>0,y<=0; 3: x<=0,y<=0; 4: x<=0,y>0) has mean mu_3 and the
    other three mu_2. Observed rewards add N(0, noise_sd^2) noise.
    """
    T = positive_int(n_steps, "n_steps")
    _check_rng(rng)
    delta = positive_scalar(delta, "delta")
    if delta >= 1:
        raise ValueError(f"delta must be in (0, 1); got {delta}")
    mu1, mu2, mu3 = (float(v) for v in as_float_array(mean_rewards, "mean_rewards", shape=(3,)))
    noise_sd = positive_scalar(noise_sd, "noise_sd")
    r = np.sqrt(rng.uniform(size=T))
    phi = rng.uniform(0.0, 2.0 * np.pi, size=T)
    S = np.stack([r * np.cos(phi), r * np.sin(phi)], axis=1)
    M = np.full((T, 5), mu2)
    M[:, 0] = mu1
    x, y = S[:, 0], S[:, 1]
    quad = np.where(x > 0, np.where(y > 0, 1, 2), np.where(y > 0, 4, 3))
    outside = np.linalg.norm(S, axis=1) > delta
    M[np.flatnonzero(outside), quad[outside]] = mu3
    R = M + noise_sd * rng.standard_normal(M.shape)
    return BanditEnvironment(S, R, M, f"wheel(delta={delta})")


def ratings_bandit(rng: np.random.Generator, n_users: int = 943, n_items: int = 20, rank: int = 20,
                   density: float = 0.3, latent_rank: int = 5, ratings: ArrayLike | None = None) -> BanditEnvironment:
    """A MovieLens-style bandit (section 4.2): users are contexts, items are arms.

    Build (or take) a sparse user x item ratings matrix X (0 = missing, 1..5),
    keep users with at least one rating, take the rank-K SVD
    X ~ U_K S_K V_K^T and use contexts U_K sqrt(S_K) and rewards
    X_hat = U_K S_K V_K^T. Rows are shuffled. Without ``ratings``, X is drawn
    from a rank-``latent_rank`` preference model, rounded to 1..5, with each
    entry observed with probability ``density``.
    """
    _check_rng(rng)
    if ratings is None:
        n_users = positive_int(n_users, "n_users")
        n_items = int_at_least(n_items, "n_items", 2)
        k = positive_int(latent_rank, "latent_rank")
        U = rng.standard_normal((n_users, k))
        V = rng.standard_normal((n_items, k))
        score = U @ V.T / np.sqrt(k) + 0.5 * rng.standard_normal((n_users, 1))
        X = np.clip(np.round(3.0 + 1.2 * score), 1, 5)
        X = X * (rng.uniform(size=X.shape) < density)
    else:
        X = as_float_array(ratings, "ratings", ndim=2)
        if X.shape[1] < 2:
            raise ValueError(f"ratings must have at least 2 items (columns); got shape {X.shape}")
    X = X[np.any(X != 0, axis=1)]
    K = min(positive_int(rank, "rank"), *X.shape)
    U, s, Vt = np.linalg.svd(X, full_matrices=False)
    ctx = U[:, :K] * np.sqrt(s[:K])
    Xhat = (U[:, :K] * s[:K]) @ Vt[:K]
    perm = rng.permutation(X.shape[0])
    return BanditEnvironment(ctx[perm], Xhat[perm], Xhat[perm], "ratings")
