"""Bandit agents (Duran-Martin, Kara & Murphy 2022, sections 3-4 and appendix A).

Every agent follows Algorithm 1 ("Online-Eval") with three pure methods:

    state = agent.init(warmup, rng)                    # Agent.InitBelief(D_tau)
    a = agent.choose(state, context, rng)              # Agent.ChooseAction(b_{t-1}, s_t)
    state = agent.update(state, context, a, y, rng)    # Agent.UpdateBelief(b_{t-1}, D_t)

States are immutable; ``update`` returns a new one. Agents:

- SubspaceAgent: the EKF on subspace coordinates (section 3.4, Algorithm 2),
  full or diagonal covariance, SVD or random basis.
- OrigEKFAgent: the EKF on all parameters, full or diagonal (section 4.1).
- LoFiAgent: the LO-FI filter (diagonal plus low-rank precision) on all parameters.
- LinearTSAgent: per-arm Bayesian linear regression on the context (appendix A.1).
- NeuralLinearAgent: Bayesian linear regression on the last hidden layer (appendix A.2, Algorithm 3).
- LiM2Agent: Neural-Linear with limited memory and likelihood matching (appendix A.3, Algorithms 4-6).
- NeuralGreedyAgent: refit the network and play greedily.
- NeuralTSAgent: neural Thompson sampling with NTK features (appendix A.4, eqs 49-53).
- RandomAgent, OracleAgent: reference policies.

The filter agents choose by Thompson sampling (the paper's policy) or UCB
(eqs 1-4) over any refbayes belief: ``thompson_params`` and ``ucb_scores``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import autograd
import autograd.numpy as anp
import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import linalg
from .._validate import nonnegative_scalar, positive_scalar
from ..beliefs import Belief
from ..errors import ConvergenceError
from ..filters.diagonal import FDEKF
from ..filters.ekf import FullEKF
from ..filters.subspace import SubspaceEKF, build_subspace, gd_trajectory
from ..likelihoods import Gaussian
from ..models import MLP, Model, activation
from .linear import (
    ArmPosteriors,
    blr_batch,
    nig_from_stats,
    nig_incremental,
    rls_update,
    sample_nig_weights,
    west_harrison_update,
)
from .memory import Memory
from .reward_model import ArmModel

if TYPE_CHECKING:
    from .environments import BanditEnvironment, Warmup

__all__ = [
    "Agent",
    "thompson_params",
    "ucb_scores",
    "FilterState",
    "SubspaceAgent",
    "OrigEKFAgent",
    "LoFiAgent",
    "LinearTSAgent",
    "NeuralLinearAgent",
    "LiM2Agent",
    "NeuralGreedyAgent",
    "NeuralTSAgent",
    "RandomAgent",
    "OracleAgent",
    "mlp_features",
    "pgd_covariance",
    "POLICIES",
    "LINEAR_UPDATES",
]

POLICIES = ("ts", "ucb")
LINEAR_UPDATES = ("west-harrison", "incremental", "batch", "rls")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _int(value, name, low=1, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer{' or None' if allow_none else ''}; got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}; got {value}")
    return int(value)


def _set_refit_schedule(agent, update_every, n_epochs, lr, momentum, memory):
    """Check and store the settings of an agent that refits its network by SGD on its memory:
    every ``update_every`` steps (None: never), ``n_epochs`` passes at rate ``lr`` with
    ``momentum``, over the last ``memory`` observations (None: all of them)."""
    agent.update_every = _int(update_every, "update_every", allow_none=True)
    agent.n_epochs = _int(n_epochs, "n_epochs", low=0)
    agent.lr = positive_scalar(lr, "lr")
    agent.momentum = nonnegative_scalar(momentum, "momentum")
    agent.memory = _int(memory, "memory", allow_none=True)


def _choice(value, name, options):
    if value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def _check_network(network):
    if not isinstance(network, Model):
        raise TypeError(f"network must be a refbayes Model; got {type(network).__name__}")
    return network


def _check_mlp(network):
    if not isinstance(network, MLP) or network.n_layers < 2:
        raise TypeError(f"network must be an MLP with at least one hidden layer; got {network!r}")
    return network


def _check_warmup(warmup):
    for attr in ("contexts", "actions", "rewards", "full_rewards", "n_arms"):
        if not hasattr(warmup, attr):
            raise TypeError(f"warmup must be a refbayes.bandits.Warmup (missing {attr!r}); got {type(warmup).__name__}")
    return warmup


def _check_context(context, n_features):
    s = np.asarray(context, dtype=np.float64)
    if s.shape != (n_features,) or not np.all(np.isfinite(s)):
        raise ValueError(f"context must be a finite vector of shape ({n_features},); got shape {s.shape}")
    return s


def _check_step(context, action, reward, n_features, n_arms):
    """Validated (s (N_s,), a, y) of one bandit step."""
    s = _check_context(context, n_features)
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
        raise TypeError(f"action must be an integer; got {action!r}")
    if not 0 <= action < n_arms:
        raise ValueError(f"action must be in [0, {n_arms}); got {action}")
    return s, int(action), _check_reward(reward)


def _check_reward(reward):
    """A bandit reward as a float: finite, or NaN for a reward that was not observed (the agent then
    learns nothing from the step; docs/streams.md). Inf is an error."""
    y = float(reward)
    if np.isinf(y):
        raise ValueError(f"reward must be finite (or NaN for a missing reward); got {reward!r}")
    return y


def _argmax(values):
    """Index of the largest value, lowest index on ties."""
    return int(np.argmax(values))


def thompson_params(bel: Belief, rng: np.random.Generator, basis: ArrayLike | None = None,
                    offset: ArrayLike | None = None) -> NDArray[np.float64]:
    """One Thompson draw of the network parameters from any refbayes belief.

    theta~ = A z~ + theta_star with z~ ~ bel (section 4, Algorithm 2); without
    ``basis`` the belief is over theta itself. Returns (P,).
    """
    if not isinstance(bel, Belief):
        raise TypeError(f"bel must be a refbayes belief; got {type(bel).__name__}")
    z = bel.sample(_check_rng(rng))
    if basis is None:
        return z
    return basis @ z + (0.0 if offset is None else offset)


def ucb_scores(arm_model: ArmModel, bel: Belief, context: ArrayLike, alpha: float, obs_var: float = 0.0,
               basis: ArrayLike | None = None, offset: ArrayLike | None = None) -> NDArray[np.float64]:
    """Upper confidence scores mu_a + alpha sigma_a for every arm (eqs 1-4), linearised.

    mu_a = f_a(s; theta_bar), sigma_a^2 = H_a Sigma H_a^T + obs_var with H_a the
    Jacobian of arm a in the belief's coordinates (J_a A in a subspace).
    theta_bar = A mean + theta_star (or the mean). Returns (N_a,).
    """
    alpha = nonnegative_scalar(alpha, "alpha")
    obs_var = nonnegative_scalar(obs_var, "obs_var")
    theta = bel.mean if basis is None else basis @ bel.mean + (0.0 if offset is None else offset)
    values, J = arm_model.arm_values_and_jacobians(theta, context)
    if alpha == 0.0:
        return values
    H = J if basis is None else J @ basis
    var = np.diag(bel.project(H)) + obs_var
    return values + alpha * np.sqrt(np.maximum(var, 0.0))


def _fit(model, X, Y, theta, n_steps, lr, momentum):
    """The last iterate of full-batch momentum gradient descent (``gd_trajectory``)."""
    return gd_trajectory(model, X, Y, theta, n_steps, lr, momentum)[-1]


class Agent:
    """Interface of Algorithm 1. Subclasses implement init, choose and update."""

    name = "agent"

    def init(self, warmup: Warmup, rng: np.random.Generator) -> Any:
        """Initial agent state from the warm-up data (a ``Warmup``) and a numpy Generator ``rng``."""
        raise NotImplementedError

    def choose(self, state: Any, context: ArrayLike, rng: np.random.Generator) -> int:
        """Index of the arm to pull for ``context`` (N_s,), given the current ``state``."""
        raise NotImplementedError

    def update(self, state: Any, context: ArrayLike, action: int, reward: float, rng: np.random.Generator) -> Any:
        """New state after observing ``reward`` for arm ``action`` in ``context``; ``state`` is not modified."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(name={self.name!r})"


# ---------------------------------------------------------------------------------------------
# filter agents: subspace EKF, EKF on all parameters, LO-FI
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FilterState:
    """State of a filter agent: the bound filter, the predicted belief for the next step,
    the arm model, and the subspace (basis, offset) when the belief is over z."""

    filter: object
    bel: Belief
    arm_model: ArmModel
    basis: object = None
    offset: object = None


class _FilterAgent(Agent):
    """Shared warm-up, policy and update for agents built on a refbayes filter.

    The belief kept in the state is the one-step-ahead prediction, so actions
    are drawn from N(mu_{t|t-1}, Sigma_{t|t-1}) (section 4) and ``update`` runs
    the filter's update then its predict step.
    """

    def __init__(self, network: Model, *, obs_var: float, prior_var: float, q: float = 0.0, policy: str = "ts",
                 alpha: float = 1.0, input: str = "heads", feedback: str = "bandit", n_warmup_steps: int = 1000,
                 lr: float = 0.05, momentum: float = 0.9, ekf_on_warmup: bool = False, name: str | None = None) -> None:
        self.network = _check_network(network)
        self.obs_var = positive_scalar(obs_var, "obs_var")
        self.prior_var = positive_scalar(prior_var, "prior_var")
        self.q = nonnegative_scalar(q, "q")
        self.policy = _choice(policy, "policy", POLICIES)
        self.alpha = nonnegative_scalar(alpha, "alpha")
        self.input = _choice(input, "input", ("heads", "blocks"))
        self.feedback = _choice(feedback, "feedback", ("bandit", "full"))
        if self.feedback == "full" and self.input != "heads":
            raise ValueError("feedback='full' needs input='heads'")
        self.n_warmup_steps = _int(n_warmup_steps, "n_warmup_steps", low=0)
        self.lr = positive_scalar(lr, "lr")
        self.momentum = nonnegative_scalar(momentum, "momentum")
        self.ekf_on_warmup = bool(ekf_on_warmup)
        if name is not None:
            self.name = str(name)

    def _arm_model(self, warmup):
        return ArmModel(self.network, warmup.n_arms, self.input)

    def _warmup_problem(self, arm, warmup):
        """(model, X, Y) of the warm-up regression (section 3.4): the pulled arms only ("bandit"),
        or every head on the warm-up contexts ("full", counterfactual; what the authors' code does)."""
        if self.feedback == "full":
            return self.network, warmup.contexts, warmup.full_rewards
        return arm, arm.arm_inputs(warmup.contexts, warmup.actions), warmup.rewards

    def _make(self, arm, warmup, rng):
        """Return (filter, prior belief, basis, offset)."""
        raise NotImplementedError

    def init(self, warmup: Warmup, rng: np.random.Generator) -> FilterState:
        _check_warmup(warmup)
        _check_rng(rng)
        arm = self._arm_model(warmup)
        filt, bel, basis, offset = self._make(arm, warmup, rng)
        if self.ekf_on_warmup:
            X = arm.arm_inputs(warmup.contexts, warmup.actions)
            bel, _ = filt.scan(bel, X, warmup.rewards)
        return FilterState(filt, filt.predict(bel), arm, basis, offset)

    def choose(self, state: FilterState, context: ArrayLike, rng: np.random.Generator) -> int:
        if self.policy == "ts":
            theta = thompson_params(state.bel, rng, state.basis, state.offset)
            return _argmax(state.arm_model.arm_values(theta, context))
        return _argmax(ucb_scores(state.arm_model, state.bel, context, self.alpha, self.obs_var,
                                  state.basis, state.offset))

    def update(self, state: FilterState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator) -> FilterState:
        x = state.arm_model.arm_input(context, action)
        bel = state.filter.update(state.bel, x, _check_reward(reward))
        return replace(state, bel=state.filter.predict(bel))


class SubspaceAgent(_FilterAgent):
    """EKF in a learned (SVD) or random subspace (section 3.4, Algorithm 2).

    network: multi-head model f(s; theta) (N_a outputs) or, with input="blocks",
    the Figure 1c network. d: subspace dimension (or a fraction of explained
    variance for basis="svd"). basis: "svd" | "random". cov: "full" | "diag"
    (diag_update "fd", the fully decoupled EKF, or "vd"); form: the full update's
    algebraic form ("covariance", or "joseph" as in the authors' code).
    Warm-up: ``n_warmup_steps`` iterations of momentum GD (lr, momentum) on the
    warm-up loss; every ``thin``-th iterate (last ``n_keep``) feeds the PCA;
    offset "warm" (theta_E) or "init" (theta_0). Prior N(0, prior_var I_d);
    observation noise obs_var; process noise q I_d.
    Defaults: obs_var 1e-3 (the authors' code uses 0 plus 1e-3 in S), prior_var 1e-4, q 0.
    """

    def __init__(self, network: Model, d: int = 200, *, basis: str = "svd", cov: str = "full", obs_var: float = 1e-3,
                 prior_var: float = 1e-4, q: float = 0.0, n_warmup_steps: int = 1000, lr: float = 0.05,
                 momentum: float = 0.9, feedback: str = "bandit", offset: str = "warm", thin: int = 2,
                 n_keep: int = 2000, svd: str = "exact", diag_update: str = "fd", form: str = "covariance",
                 ekf_on_warmup: bool = False, policy: str = "ts", alpha: float = 1.0, input: str = "heads",
                 name: str | None = None) -> None:
        if n_warmup_steps < 1:
            raise ValueError(f"n_warmup_steps must be >= 1; got {n_warmup_steps}")
        super().__init__(network, obs_var=obs_var, prior_var=prior_var, q=q, policy=policy, alpha=alpha, input=input,
                         feedback=feedback, n_warmup_steps=n_warmup_steps, lr=lr, momentum=momentum,
                         ekf_on_warmup=ekf_on_warmup)
        if isinstance(d, (float, np.floating)):
            if not 0 < d < 1:
                raise ValueError(f"d must be an int >= 1 or a fraction in (0, 1); got {d}")
            if basis != "svd":
                raise ValueError("a fractional d needs basis='svd'")
            self.d = float(d)
        else:
            self.d = _int(d, "d")
        self.basis = _choice(basis, "basis", ("svd", "random"))
        self.cov = _choice(cov, "cov", ("full", "diag"))
        self.offset = _choice(offset, "offset", ("warm", "init"))
        self.thin = _int(thin, "thin")
        self.n_keep = _int(n_keep, "n_keep", allow_none=True)
        self.svd = _choice(svd, "svd", ("exact", "randomized"))
        self.diag_update = _choice(diag_update, "diag_update", ("fd", "vd"))
        self.form = _choice(form, "form", ("covariance", "joseph", "information"))
        self.name = name or f"EKF-Sub{'-Diag' if cov == 'diag' else ''}-{'SVD' if basis == 'svd' else 'RND'}"

    def _make(self, arm, warmup, rng):
        model, X, Y = self._warmup_problem(arm, warmup)
        sub = build_subspace(model, X, Y, self.d, rng, kind=self.basis, offset=self.offset,
                             n_steps=self.n_warmup_steps, lr=self.lr, momentum=self.momentum, thin=self.thin,
                             n_keep=self.n_keep, svd=self.svd)
        filt = SubspaceEKF(arm, Gaussian(self.obs_var), basis=sub.basis, offset=sub.offset, cov=self.cov, q=self.q,
                           diag_update=self.diag_update, form=self.form)
        return filt, filt.init(None, self.prior_var), sub.basis, sub.offset


class OrigEKFAgent(_FilterAgent):
    """EKF over all P parameters (section 4.1, "EKF-Orig"): cov "full" (FullEKF) or "diag" (FD-EKF).

    init="warm": prior mean theta_warm from ``n_warmup_steps`` GD iterations on
    the warm-up data; init="zero": prior mean 0, so the network is evaluated at
    theta = 0 (what the authors' code ends up doing; a ReLU network then only
    learns the output biases). Defaults: the paper's tabular settings (E = 100,
    prior_var 1e-3, obs_var 0.01).
    """

    def __init__(self, network: Model, *, cov: str = "diag", obs_var: float = 0.01, prior_var: float = 1e-3,
                 q: float = 0.0, init: str = "warm", n_warmup_steps: int = 100, lr: float = 0.05, momentum: float = 0.9,
                 feedback: str = "bandit", ekf_on_warmup: bool = False, policy: str = "ts", alpha: float = 1.0,
                 input: str = "heads", name: str | None = None) -> None:
        super().__init__(network, obs_var=obs_var, prior_var=prior_var, q=q, policy=policy, alpha=alpha, input=input,
                         feedback=feedback, n_warmup_steps=n_warmup_steps, lr=lr, momentum=momentum,
                         ekf_on_warmup=ekf_on_warmup)
        self.cov = _choice(cov, "cov", ("full", "diag"))
        self.init_mode = _choice(init, "init", ("warm", "zero"))
        self.name = name or f"EKF-Orig-{'Full' if cov == 'full' else 'Diag'}"

    def _warm_mean(self, arm, warmup, rng):
        theta0 = self.network.init_params(rng)
        if self.init_mode == "zero":
            return np.zeros(self.network.n_params)
        if self.n_warmup_steps == 0:
            return theta0
        model, X, Y = self._warmup_problem(arm, warmup)
        return _fit(model, X, Y, theta0, self.n_warmup_steps, self.lr, self.momentum)

    def _make(self, arm, warmup, rng):
        mean = self._warm_mean(arm, warmup, rng)
        cls = FullEKF if self.cov == "full" else FDEKF
        filt = cls(arm, Gaussian(self.obs_var), q=self.q)
        return filt, filt.init(mean, self.prior_var), None, None


class LoFiAgent(OrigEKFAgent):
    """LO-FI (diagonal plus low-rank precision) over all parameters, from a warm-started mean.

    Needs refbayes.filters.lofi (imported when the agent is initialised).
    ``rank``: the low-rank size L; other arguments as OrigEKFAgent.
    """

    def __init__(self, network: Model, rank: int = 10, *, obs_var: float = 0.01, prior_var: float = 1e-3,
                 q: float = 0.0, init: str = "warm", n_warmup_steps: int = 100, lr: float = 0.05, momentum: float = 0.9,
                 feedback: str = "bandit", ekf_on_warmup: bool = False, policy: str = "ts", alpha: float = 1.0,
                 input: str = "heads", name: str | None = None, **lofi_kwargs: Any) -> None:
        super().__init__(network, cov="diag", obs_var=obs_var, prior_var=prior_var, q=q, init=init,
                         n_warmup_steps=n_warmup_steps, lr=lr, momentum=momentum, feedback=feedback,
                         ekf_on_warmup=ekf_on_warmup, policy=policy, alpha=alpha, input=input)
        self.rank = _int(rank, "rank", low=0)
        self.lofi_kwargs = dict(lofi_kwargs)
        self.name = name or f"LOFI-{self.rank}"

    def _make(self, arm, warmup, rng):
        from ..filters.lofi import LoFi  # optional module, imported on use

        mean = self._warm_mean(arm, warmup, rng)
        filt = LoFi(arm, Gaussian(self.obs_var), rank=self.rank, gamma=1.0, q=self.q, **self.lofi_kwargs)
        return filt, filt.init(mean, self.prior_var), None, None


# ---------------------------------------------------------------------------------------------
# Linear TS (appendix A.1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LinearState:
    """Per-arm posteriors plus the representation the chosen update form keeps:
    ``prec`` (K, D, D) for "incremental", ``stats`` (Phi, psi, R2, N) for "batch"."""

    post: ArmPosteriors
    prec: object = None
    stats: object = None


def _stats_from_data(X, actions, y, K):
    D = X.shape[1]
    Phi, psi = np.zeros((K, D, D)), np.zeros((K, D))
    R2, N = np.zeros(K), np.zeros(K)
    for k in range(K):
        m = actions == k
        Xk, yk = X[m], y[m]
        Phi[k], psi[k], R2[k], N[k] = Xk.T @ Xk, Xk.T @ yk, yk @ yk, m.sum()
    return Phi, psi, R2, N


def _posts_from_stats(mu0, Sigma0, a0, b0, stats):
    Phi, psi, R2, N = stats
    K = Phi.shape[0]
    mu0 = np.broadcast_to(mu0, psi.shape)
    Sigma0 = np.broadcast_to(Sigma0, Phi.shape)
    return ArmPosteriors.stack([nig_from_stats(mu0[k], Sigma0[k], a0, b0, Phi[k], psi[k], R2[k], N[k])
                                for k in range(K)])


class LinearTSAgent(Agent):
    """Linear Thompson sampling, one Bayesian linear regression per arm on x = s (appendix A.1).

    Prior w_a ~ N(0, lam^{-1} I) and sigma_a^2 ~ IG(a0, b0) (unknown variance),
    warm-up data used as one batch (eqs 16-20), then one of the equivalent
    incremental forms: "west-harrison" (inverse-free, eqs 31-37; default),
    "incremental" (precision form, eqs 21-25), "batch" (recompute from
    sufficient statistics, eqs 16-20), or "rls" (known variance ``obs_var``,
    eqs 5-15; no variance sampling). TS: sigma~^2 ~ IG(a, b), w~ ~ N(mu, sigma~^2 Sigma).
    """

    def __init__(self, lam: float = 0.25, a0: float = 6.0, b0: float = 6.0, update: str = "west-harrison",
                 obs_var: float = 1.0, name: str | None = None) -> None:
        self.lam = positive_scalar(lam, "lam")
        self.a0 = positive_scalar(a0, "a0")
        self.b0 = positive_scalar(b0, "b0")
        self.update_form = _choice(update, "update", LINEAR_UPDATES)
        self.obs_var = positive_scalar(obs_var, "obs_var")
        self.name = name or "Linear" + ("" if update == "west-harrison" else f"-{update}")

    def _prior(self, D):
        return np.zeros(D), np.eye(D) / self.lam

    def posteriors_from_data(self, X: NDArray[np.float64], actions: NDArray[np.integer], y: NDArray[np.float64],
                             K: int) -> ArmPosteriors:
        """Batch posteriors of all arms from data X (N, D), actions (N,), y (N,)."""
        D = X.shape[1]
        mu0, S0 = self._prior(D)
        if self.update_form == "rls":
            posts = []
            for k in range(K):
                m = actions == k
                mu, S = blr_batch(mu0, S0, X[m], y[m], self.obs_var)
                posts.append((mu, S, self.a0, self.b0))
            return ArmPosteriors.stack(posts)
        return _posts_from_stats(mu0, S0, self.a0, self.b0, _stats_from_data(X, actions, y, K))

    def init(self, warmup: Warmup, rng: np.random.Generator) -> LinearState:
        _check_warmup(warmup)
        X = np.asarray(warmup.contexts, dtype=np.float64)
        acts, y, K = np.asarray(warmup.actions), np.asarray(warmup.rewards, dtype=np.float64), warmup.n_arms
        post = self.posteriors_from_data(X, acts, y, K)
        prec = stats = None
        if self.update_form == "incremental":
            D = X.shape[1]
            prec = np.stack([np.eye(D) * self.lam + X[acts == k].T @ X[acts == k] for k in range(K)])
        elif self.update_form == "batch":
            stats = _stats_from_data(X, acts, y, K)
        return LinearState(post, prec, stats)

    def choose(self, state: LinearState, context: ArrayLike, rng: np.random.Generator) -> int:
        known = self.obs_var if self.update_form == "rls" else None
        x = _check_context(context, state.post.n_features)
        W = sample_nig_weights(state.post, _check_rng(rng), known_var=known)
        return _argmax(W @ x)

    def update(self, state: LinearState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> LinearState:
        p = state.post
        x, k, y = _check_step(context, action, reward, p.n_features, p.n_arms)
        if np.isnan(y):  # a missing reward carries no information
            return state
        if self.update_form == "west-harrison":
            mu, S, nu, nutau = west_harrison_update(p.mu[k], p.cov[k], 2 * p.a[k], 2 * p.b[k], x, y)
            return replace(state, post=p.replace_arm(k, mu, S, nu / 2, nutau / 2))
        if self.update_form == "rls":
            mu, S = rls_update(p.mu[k], p.cov[k], x, y, self.obs_var)
            return replace(state, post=p.replace_arm(k, mu, S, p.a[k], p.b[k]))
        if self.update_form == "incremental":
            mu, prec, a, b = nig_incremental(p.mu[k], state.prec[k], p.a[k], p.b[k], x, y)
            S = linalg.symmetrize(linalg.psd_solve(prec, np.eye(x.shape[0]), name="posterior precision"))
            P = state.prec.copy()
            P[k] = prec
            return LinearState(p.replace_arm(k, mu, S, a, b), P, None)
        Phi, psi, R2, N = (s.copy() for s in state.stats)
        Phi[k] += np.outer(x, x)
        psi[k] += x * y
        R2[k] += y * y
        N[k] += 1
        mu0, S0 = self._prior(x.shape[0])
        post = p.replace_arm(k, *nig_from_stats(mu0, S0, self.a0, self.b0, Phi[k], psi[k], R2[k], N[k]))
        return LinearState(post, None, (Phi, psi, R2, N))


# ---------------------------------------------------------------------------------------------
# Neural-Linear, LiM2, Neural-Greedy, Neural-TS
# ---------------------------------------------------------------------------------------------


def mlp_features(network: MLP, theta: ArrayLike, S: ArrayLike) -> NDArray[np.float64]:
    """phi(s; V): the last hidden layer of an MLP (after its activation). S (N, N_s) -> (N, N_z)."""
    H = np.asarray(S, dtype=np.float64)
    for W, b in network.unflatten(theta)[:-1]:
        H = activation(network.activation, H @ W.T + b)
    return np.asarray(H)


def _head(network, theta):
    """Last-layer weights W (N_a, N_z) and bias (N_a,)."""
    return network.unflatten(theta)[-1]


@dataclass(frozen=True, eq=False)
class NeuralLinearState:
    """theta (P,); memory; per-arm NIG posteriors over the features; sufficient statistics
    (Phi, psi, R2, N); the prior (mu0 (K, N_z), Sigma0 (K, N_z, N_z)); steps since init."""

    theta: np.ndarray
    memory: Memory
    post: ArmPosteriors
    stats: tuple
    prior: tuple
    steps: int = 0


class NeuralLinearAgent(Agent):
    """Neural-Linear (Riquelme et al. 2018; appendix A.2, Algorithm 3).

    network: an MLP with one head per arm; phi is its last hidden layer (N_z).
    Every ``update_every`` steps (None: never after the warm-up) the network is
    refit with ``n_epochs`` full-batch momentum-GD iterations on the memory
    (loss mean 1/2 (f_a(s) - y)^2 over pulled arms), the features of the whole
    memory are recomputed and each arm's NIG posterior is recomputed from its
    prior N(0, lam^{-1} I), IG(a0, b0) and the sufficient statistics. Between
    refits (phi_t, y_t) is added to the pulled arm's statistics.
    memory: None (unlimited, "NL-Unlim") or a FIFO size ("NL-Lim").
    """

    def __init__(self, network: MLP, *, update_every: int | None = 100, n_epochs: int = 100, lr: float = 0.05,
                 momentum: float = 0.9, memory: int | None = None, lam: float = 0.25, a0: float = 6.0, b0: float = 6.0,
                 name: str | None = None) -> None:
        self.network = _check_mlp(network)
        _set_refit_schedule(self, update_every, n_epochs, lr, momentum, memory)
        self.lam = positive_scalar(lam, "lam")
        self.a0 = positive_scalar(a0, "a0")
        self.b0 = positive_scalar(b0, "b0")
        self.name = name or ("NL-Unlim" if memory is None else "NL-Lim")

    def _train(self, theta, mem):
        if self.n_epochs == 0 or len(mem) == 0:
            return theta
        arm = ArmModel(self.network)
        X = arm.arm_inputs(mem.contexts, mem.actions)
        return _fit(arm, X, mem.rewards, theta, self.n_epochs, self.lr, self.momentum)

    def _capacity(self, warmup):
        return self.memory

    def _refresh(self, theta, mem, prior):
        """Features of all memory, statistics and posteriors (Algorithm 3, the SGD branch)."""
        phi = mlp_features(self.network, theta, mem.contexts)
        stats = _stats_from_data(phi, np.asarray(mem.actions), np.asarray(mem.rewards), self.network.out_dim)
        return stats, _posts_from_stats(prior[0], prior[1], self.a0, self.b0, stats)

    def _prior(self):
        K, Nz = self.network.out_dim, self.network.layer_sizes[-2]
        return np.zeros((K, Nz)), np.broadcast_to(np.eye(Nz) / self.lam, (K, Nz, Nz)).copy()

    def init(self, warmup: Warmup, rng: np.random.Generator) -> NeuralLinearState:
        _check_warmup(warmup)
        if warmup.n_arms != self.network.out_dim:
            raise ValueError(f"network must have one output per arm ({warmup.n_arms}); got {self.network.out_dim}")
        mem = Memory.from_arrays(warmup.contexts, warmup.actions, warmup.rewards, self._capacity(warmup))
        theta = self._train(self.network.init_params(_check_rng(rng)), mem)
        prior = self._prior()
        stats, post = self._refresh(theta, mem, prior)
        return NeuralLinearState(theta, mem, post, stats, prior, 0)

    def choose(self, state: NeuralLinearState, context: ArrayLike, rng: np.random.Generator) -> int:
        s = _check_context(context, self.network.in_dim)
        W = sample_nig_weights(state.post, _check_rng(rng))
        phi = mlp_features(self.network, state.theta, s[None])[0]
        return _argmax(W @ phi)

    def update(self, state: NeuralLinearState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> NeuralLinearState:
        s, k, y = _check_step(context, action, reward, self.network.in_dim, self.network.out_dim)
        if np.isnan(y):  # a missing reward carries no information
            return state
        mem = state.memory.push(s, k, y)
        steps = state.steps + 1
        if self.update_every is not None and steps % self.update_every == 0:
            theta = self._train(state.theta, mem)
            stats, post = self._refresh(theta, mem, state.prior)
            return NeuralLinearState(theta, mem, post, stats, state.prior, steps)
        phi = mlp_features(self.network, state.theta, s[None])[0]
        Phi, psi, R2, N = (a.copy() for a in state.stats)
        Phi[k] += np.outer(phi, phi)
        psi[k] += phi * y
        R2[k] += y * y
        N[k] += 1
        post = state.post.replace_arm(k, *nig_from_stats(state.prior[0][k], state.prior[1][k], self.a0, self.b0,
                                                         Phi[k], psi[k], R2[k], N[k]))
        return NeuralLinearState(state.theta, mem, post, (Phi, psi, R2, N), state.prior, steps)


def pgd_covariance(A0: ArrayLike, phi_old: ArrayLike, phi_new: ArrayLike, lr: float | None = None,
                   n_steps: int = 1) -> NDArray[np.float64]:
    """Likelihood-matching prior covariance by projected gradient descent (Algorithm 6).

    Minimise sum_j (phi_j^T A phi_j - s_j^2)^2 over PSD A, with
    s_j^2 = phi_old_j^T A0 phi_old_j: g = 2 sum_j (tr(A Phi_j) - s_j^2) Phi_j,
    A <- A - lr g, then clip negative eigenvalues to 0. A0 (D, D) PSD;
    phi_old, phi_new (n, D). lr None uses 1 / (2 sum_j ||phi_j||^4), a step
    that cannot increase the objective (the gradient is Lipschitz with at most
    that constant). Returns A (D, D).
    """
    A = linalg.symmetrize(np.asarray(A0, dtype=np.float64))
    phi_old = np.asarray(phi_old, dtype=np.float64)
    phi_new = np.asarray(phi_new, dtype=np.float64)
    if phi_new.shape[0] == 0:
        return A
    s2 = np.einsum("ji,ik,jk->j", phi_old, A, phi_old)
    if lr is None:
        L = 2.0 * np.sum(np.sum(phi_new**2, axis=1) ** 2)
        if L == 0.0:
            return A
        lr = 1.0 / L
    lr = positive_scalar(lr, "lr")
    for _ in range(_int(n_steps, "n_steps")):
        r = np.einsum("ji,ik,jk->j", phi_new, A, phi_new) - s2
        g = 2.0 * (phi_new.T * r) @ phi_new
        lam, V = np.linalg.eigh(linalg.symmetrize(A - lr * g))
        A = linalg.symmetrize((V * np.maximum(lam, 0.0)) @ V.T)
    return A


def _clipped(g, clip):
    if clip is None:
        return g
    n = np.linalg.norm(g)
    return g * (clip / n) if n > clip else g


class LiM2Agent(NeuralLinearAgent):
    """LiM2: limited-memory Neural-Linear with likelihood matching (Nabati et al. 2021; Algorithms 4-6).

    FIFO memory of ``memory`` rows (default 100 N_a). After every step
    (Algorithm 5): ``n_sgd`` times, draw a minibatch of ``batch_size`` rows
    (default 16 N_a) from memory, compute phi_old, take one SGD step (``lr``,
    gradient norm clipped at ``clip``), compute phi_new and, for every arm,
    replace its prior covariance by ``pgd_covariance`` (``pgd_steps``,
    ``pgd_lr``) and its prior mean by the arm's head weights. Then the NIG
    posteriors over the memory are recomputed from the updated priors.
    n_sgd None means one pass over the memory. The warm-up fit uses
    ``n_epochs`` full-batch momentum-GD iterations as Neural-Linear.
    """

    def __init__(self, network: MLP, *, memory: int | None = None, n_sgd: int | None = None,
                 batch_size: int | None = None, lr: float = 0.1, clip: float = 5.0, pgd_steps: int = 1,
                 pgd_lr: float | None = None, lam_prior: float = 1.0, a0: float = 6.0, b0: float = 6.0,
                 n_epochs: int = 100, warmup_lr: float = 0.05, momentum: float = 0.9, name: str | None = None) -> None:
        super().__init__(network, update_every=None, n_epochs=n_epochs, lr=warmup_lr, momentum=momentum,
                         memory=memory, lam=lam_prior, a0=a0, b0=b0, name=name or "LiM2")
        self.sgd_lr = positive_scalar(lr, "lr")
        self.n_sgd = _int(n_sgd, "n_sgd", allow_none=True)
        self.batch_size = _int(batch_size, "batch_size", allow_none=True)
        self.clip = None if clip is None else positive_scalar(clip, "clip")
        self.pgd_steps = _int(pgd_steps, "pgd_steps")
        self.pgd_lr = None if pgd_lr is None else positive_scalar(pgd_lr, "pgd_lr")
        self._arm = ArmModel(self.network)

        def loss(theta, X, y):
            r = self._arm.apply_batch(theta, X)[:, 0] - y
            return 0.5 * anp.mean(r * r)

        self._grad = autograd.grad(loss)

    def _capacity(self, warmup):
        return 100 * warmup.n_arms if self.memory is None else self.memory

    def update(self, state: NeuralLinearState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator) -> NeuralLinearState:
        _check_rng(rng)
        K = self.network.out_dim
        step = _check_step(context, action, reward, self.network.in_dim, K)
        if np.isnan(step[2]):  # a missing reward carries no information
            return state
        mem = state.memory.push(*step)
        n = len(mem)
        nb = min(n, self.batch_size or 16 * K)
        n_sgd = self.n_sgd or int(np.ceil(n / nb))
        theta = state.theta
        mu0, S0 = state.prior[0].copy(), state.prior[1].copy()
        S_all, A_all, Y_all = mem.contexts, np.asarray(mem.actions), mem.rewards
        for _ in range(n_sgd):
            idx = rng.choice(n, size=nb, replace=False)
            S, A, Y = S_all[idx], A_all[idx], Y_all[idx]
            phi_old = mlp_features(self.network, theta, S)
            theta = theta - self.sgd_lr * _clipped(self._grad(theta, self._arm.arm_inputs(S, A), Y), self.clip)
            phi_new = mlp_features(self.network, theta, S)
            W, _ = _head(self.network, theta)
            for k in range(K):
                m = A == k
                S0[k] = pgd_covariance(S0[k], phi_old[m], phi_new[m], self.pgd_lr, self.pgd_steps)
                mu0[k] = W[k]
        prior = (mu0, S0)
        stats, post = self._refresh(theta, mem, prior)
        return NeuralLinearState(theta, mem, post, stats, prior, state.steps + 1)


@dataclass(frozen=True, eq=False)
class NetworkState:
    """theta (P,); memory; n_arms; steps since init; extra: agent-specific (Neural-TS: theta0, B^{-1})."""

    theta: np.ndarray
    memory: Memory
    n_arms: int
    steps: int = 0
    extra: object = None


class NeuralGreedyAgent(Agent):
    """Neural-Greedy: refit the network on the memory every ``update_every`` steps and play
    argmax_a f_a(s; theta) (section 3.3, Table 1)."""

    def __init__(self, network: Model, *, update_every: int | None = 100, n_epochs: int = 100, lr: float = 0.05,
                 momentum: float = 0.9, memory: int | None = None, input: str = "heads",
                 name: str | None = None) -> None:
        self.network = _check_network(network)
        _set_refit_schedule(self, update_every, n_epochs, lr, momentum, memory)
        self.input = _choice(input, "input", ("heads", "blocks"))
        self.name = name or "Neural-Greedy"

    def _loss_model(self, n_arms):
        return ArmModel(self.network, n_arms, self.input)

    def _train(self, theta, mem, n_arms, theta0=None):
        if self.n_epochs == 0 or len(mem) == 0:
            return theta
        arm = self._loss_model(n_arms)
        return _fit(arm, arm.arm_inputs(mem.contexts, mem.actions), mem.rewards, theta, self.n_epochs, self.lr,
                    self.momentum)

    def init(self, warmup: Warmup, rng: np.random.Generator) -> NetworkState:
        _check_warmup(warmup)
        mem = Memory.from_arrays(warmup.contexts, warmup.actions, warmup.rewards, self.memory)
        theta = self._train(self.network.init_params(_check_rng(rng)), mem, warmup.n_arms)
        return NetworkState(theta, mem, warmup.n_arms, 0, None)

    def choose(self, state: NetworkState, context: ArrayLike, rng: np.random.Generator) -> int:
        return _argmax(self._loss_model(state.n_arms).arm_values(state.theta, context))

    def update(self, state: NetworkState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> NetworkState:
        step = _check_step(context, action, reward, state.memory.contexts.shape[1], state.n_arms)
        if np.isnan(step[2]):  # a missing reward carries no information
            return state
        mem = state.memory.push(*step)
        steps = state.steps + 1
        theta = state.theta
        if self.update_every is not None and steps % self.update_every == 0:
            theta = self._train(theta, mem, state.n_arms)
        return NetworkState(theta, mem, state.n_arms, steps, state.extra)


class NeuralTSAgent(NeuralGreedyAgent):
    """Neural Thompson sampling (Zhang et al. 2021; appendix A.4, eqs 49-53).

    phi_{t,a} = scale * grad_theta f(s_t, a; theta_{t-1}) with scale
    1/sqrt(N_h) (N_h: the MLP's first hidden width) unless given. B_0 = lam I,
    B_t = B_{t-1} + phi_{t,a_t} phi_{t,a_t}^T. Play argmax_a r~_a with
    r~_a ~ N(f(s_t, a; theta_{t-1}), nu^2 lam phi_{t,a}^T B_{t-1}^{-1} phi_{t,a}).
    Every ``update_every`` steps (1: every step, as the paper describes) theta
    is refit on all the data with ``n_epochs`` momentum-GD iterations on
    mean 1/2 (f - y)^2 + reg/2 ||theta - theta_0||^2.
    precision="full" keeps B^{-1} (P, P) by Sherman-Morrison (O(P^2) per step);
    "diag" keeps diag(B) only (the cheaper approximation). input: "heads"
    (Figure 1a) or "blocks" (Figure 1c, the original method's input).
    """

    def __init__(self, network: Model, *, lam: float = 1.0, nu: float = 0.1, scale: float | None = None,
                 update_every: int | None = 1, n_epochs: int = 100, lr: float = 0.01, momentum: float = 0.9,
                 reg: float = 0.0, precision: str = "full", memory: int | None = None, input: str = "heads",
                 name: str | None = None) -> None:
        super().__init__(network, update_every=update_every, n_epochs=n_epochs, lr=lr, momentum=momentum,
                         memory=memory, input=input, name=name or "Neural-TS")
        self.lam = positive_scalar(lam, "lam")
        self.nu = nonnegative_scalar(nu, "nu")
        self.reg = nonnegative_scalar(reg, "reg")
        self.precision = _choice(precision, "precision", ("full", "diag"))
        if scale is None:
            if not isinstance(network, MLP) or network.n_layers < 2:
                raise ValueError("scale is required unless network is an MLP with a hidden layer")
            scale = 1.0 / np.sqrt(network.layer_sizes[1])
        self.scale = positive_scalar(scale, "scale")

    def _train(self, theta, mem, n_arms, theta0=None):
        if self.n_epochs == 0 or len(mem) == 0:
            return theta
        arm = self._loss_model(n_arms)
        X, y = arm.arm_inputs(mem.contexts, mem.actions), np.asarray(mem.rewards)
        th0 = theta if theta0 is None else theta0
        reg = self.reg

        def loss(th):
            r = arm.apply_batch(th, X)[:, 0] - y
            d = th - th0
            return 0.5 * anp.mean(r * r) + 0.5 * reg * anp.dot(d, d)

        grad = autograd.grad(loss)
        m = np.zeros_like(theta)
        with np.errstate(over="ignore", invalid="ignore"):
            for _ in range(self.n_epochs):
                m = grad(theta) + self.momentum * m
                theta = theta - self.lr * m
        if not np.all(np.isfinite(theta)):
            raise ConvergenceError(f"Neural-TS refit diverged (non-finite parameters); use a smaller lr than {self.lr}")
        return theta

    def init(self, warmup: Warmup, rng: np.random.Generator) -> NetworkState:
        _check_warmup(warmup)
        mem = Memory.from_arrays(warmup.contexts, warmup.actions, warmup.rewards, self.memory)
        theta0 = self.network.init_params(_check_rng(rng))
        theta = self._train(theta0, mem, warmup.n_arms, theta0)
        P = self.network.n_params
        Binv = np.eye(P) / self.lam if self.precision == "full" else np.full(P, 1.0 / self.lam)
        arm = self._loss_model(warmup.n_arms)
        for s, a in zip(warmup.contexts, warmup.actions):  # B includes the warm-up pulls
            Binv = self._absorb(Binv, self.scale * arm.jacobian(theta, arm.arm_input(s, int(a)))[0])
        return NetworkState(theta, mem, warmup.n_arms, 0, (theta0, Binv))

    def _absorb(self, Binv, phi):
        if self.precision == "diag":
            return 1.0 / (1.0 / Binv + phi * phi)
        Bp = Binv @ phi
        return linalg.symmetrize(Binv - np.outer(Bp, Bp) / (1.0 + phi @ Bp))

    def _features(self, state, context):
        values, J = self._loss_model(state.n_arms).arm_values_and_jacobians(state.theta, context)
        return values, self.scale * J

    def choose(self, state: NetworkState, context: ArrayLike, rng: np.random.Generator) -> int:
        _check_rng(rng)
        values, Phi = self._features(state, context)
        Binv = state.extra[1]
        quad = np.einsum("ap,p,ap->a", Phi, Binv, Phi) if self.precision == "diag" else np.einsum(
            "ap,pq,aq->a", Phi, Binv, Phi)
        sd = self.nu * np.sqrt(self.lam * np.maximum(quad, 0.0))
        return _argmax(values + sd * rng.standard_normal(values.shape))

    def update(self, state: NetworkState, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> NetworkState:
        arm = self._loss_model(state.n_arms)
        s, a, y = _check_step(context, action, reward, arm.n_features, state.n_arms)
        if np.isnan(y):  # a missing reward carries no information
            return state
        phi = self.scale * arm.jacobian(state.theta, arm.arm_input(s, a))[0]
        theta0, Binv = state.extra
        Binv = self._absorb(Binv, phi)
        mem = state.memory.push(s, a, y)
        steps = state.steps + 1
        theta = state.theta
        if self.update_every is not None and steps % self.update_every == 0:
            theta = self._train(theta, mem, state.n_arms, theta0)
        return NetworkState(theta, mem, state.n_arms, steps, (theta0, Binv))


# ---------------------------------------------------------------------------------------------
# reference policies
# ---------------------------------------------------------------------------------------------


class RandomAgent(Agent):
    """Uniformly random arms (the chance baseline T / N_a)."""

    name = "Random"

    def init(self, warmup: Warmup, rng: np.random.Generator) -> int:
        return _check_warmup(warmup).n_arms

    def choose(self, state: int, context: ArrayLike, rng: np.random.Generator) -> int:
        return int(_check_rng(rng).integers(state))

    def update(self, state: int, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> int:
        return state


class OracleAgent(Agent):
    """Plays the best expected arm of a known environment (reward 1 at every step of a classification bandit).

    The state is the step index; it assumes the run loop visits the steps in order.
    """

    name = "Oracle"

    def __init__(self, env: BanditEnvironment) -> None:
        self.best = np.asarray(env.best_actions())

    def init(self, warmup: Warmup, rng: np.random.Generator) -> int:
        return _check_warmup(warmup).n_steps

    def choose(self, state: int, context: ArrayLike, rng: np.random.Generator) -> int:
        return int(self.best[state])

    def update(self, state: int, context: ArrayLike, action: int, reward: float,
               rng: np.random.Generator | None = None) -> int:
        return state + 1
