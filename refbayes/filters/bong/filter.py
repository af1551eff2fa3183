"""The Bong filter class: binds a model, a likelihood and one of the 76 method choices.

Jones, Chang & Murphy (2024), Algorithms 1-3. Each step predicts, then runs
``n_iter`` inner iterations: the estimator gives (g, G) at the current
iterate (fresh draws or a fresh linearisation each time) and the inner step
for (algorithm, family) moves the iterate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ... import memory
from ..._validate import as_float_array, int_at_least, positive_int, positive_or_vector, positive_scalar
from ...errors import DivergenceError, inner_iteration
from .._compat import deprecated_stored_rng, keyword_renamed
from .._observed import nothing_observed
from ..base import Filter, check_belief_finite, has_missing, split_missing
from ..diagonal import VD_MEAN_RULES
from ..lofi import _rank_within
from . import compiled
from . import estimators as est_mod
from .algorithms import ALGORITHMS, folds_predict, full_one_step, get_step, supports
from .estimators import ESTIMATORS, lin_from_linearization
from .families import BELIEF_TYPES, init_belief, ou_dynamics, predict
from .names import FAMILY_NAMES, format_name, internal_family, parse_name, public_family

if TYPE_CHECKING:
    from ...beliefs import DLR, Diag, FullCov
    from ...likelihoods import Likelihood
    from ...models import Model
    from .estimators import Estimate

__all__ = ["Bong", "DYNAMICS", "HESS_DIAG_RULES"]

DYNAMICS = ("standard", "ou")
HESS_DIAG_RULES = ("hutchinson", "exact")


def _choice(value, options, name):
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def _check_flag(value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"vdekf_mean must be True or False; got {value!r}")


class Bong(Filter):
    """BONG, BLR, BOG and BBB over five variational families with four gradient/Hessian estimators.

    Parameters
    ----------
    algorithm : "bong" | "blr" | "bog" | "bbb"
        Natural-gradient step from the prior (BONG, BOG: one step; BONG has
        no learning rate), or iterated VI with an explicit KL term (BLR: natural
        gradient, BBB: plain gradient; ``n_iter`` iterations). BOG is one plain
        gradient step from the prior.
    family : "full" | "full-moment" | "diag" | "diag-moment" | "dlr"
        As in the paper's legend: "full"/"diag" (FC, Diag) move the natural parameters
        (precision-weighted mean, precision), "full-moment"/"diag-moment" (FC_MOM,
        Diag_MOM) the moment parameters (mean, covariance / variances), "dlr" a
        diagonal-plus-rank-``rank`` precision. Beliefs are FullCov, Diag or DLR.
        Changed in 0.2: "full"/"diag" meant the moment forms in 0.1; the 0.1 spellings
        "full-natural"/"diag-natural" still work (DeprecationWarning). See CHANGELOG.md.
    estimator : "mc-hess" | "mc-ef" | "lin-hess" | "lin-ef"
        See refbayes.filters.bong.estimators. "dlr" with "mc-hess" is undefined.
    n_samples : int
        M, Monte Carlo draws per inner iteration (MC estimators).
    n_iter : int
        I, inner iterations (BLR, BBB; must be 1 for BONG and BOG).
    lr : float or None
        alpha. None means 1 for BONG (the only value it accepts); required for
        the other algorithms; BLR with "dlr" needs lr <= 1.
    rank : int
        R >= 0, the low rank of the "dlr" family (ignored otherwise).
    gamma, q : dynamics theta_t = gamma theta_{t-1} + N(0, diag(q)) (dynamics="standard").
    dynamics : "standard" | "ou"
        "ou" is the paper's mean-reverting model (Sec. 3): b = (1 - gamma) ou_mean,
        Q = (1 - gamma^2) diag(ou_var); then q must be 0 and gamma <= 1.
    rng : deprecated
        A Generator stored on the filter and advanced by every call (DeprecationWarning).
        Pass ``rng=`` to ``update``, ``update_batch``, ``predict_update`` or ``scan``
        instead (a per-call rng wins); without one an MC estimator raises TypeError.
        The draws are ``bel.sample(rng, n_samples)`` at each inner iteration.
    hess_diag : "hutchinson" | "exact"
        MC-HESS with a diagonal family: Hutchinson probes (``n_probes`` each,
        paper Sec. E.3) or the exact diagonal (builds P x P Hessians; small P only).
        With ``backend="numba"`` on an MLP or ``rb.Linear`` (Gaussian or categorical
        likelihood), "hutchinson" is compiled: exact Hessian-vector products from
        forward and reverse passes of directional derivatives (docs/bong.md §6).
    antithetic : bool
        MC draws in antithetic pairs (theta, 2 mean - theta); n_samples must be even.
    vd_mean : "paper" | "ekf"
        BONG with family "diag": "paper" (default) is the paper's eq. 213; "ekf" the
        full-gain mean of the authors' code (the EKF mean from the diagonal prior, as
        ``VDEKF(vd_mean="ekf")``; needs a factor curvature: not "mc-hess"). The 0.1
        boolean ``vdekf_mean=True/False`` is a deprecated spelling of "ekf"/"paper".
    symmetrize : bool
        BOG/BBB with "full": symmetric precision gradient (default) or
        the paper's non-symmetric one (eqs 142, 148).
    backend : "numpy" | "numba" | "cuda"
        "numpy" is the reference. "cuda" (BONG with LIN-HESS over "diag" or "dlr", standard
        dynamics, an MLP or rb.Linear with a Gaussian or categorical likelihood; anything else raises
        ValueError here) keeps the belief on the GPU (a rb.DeviceDiag or rb.DeviceDLR) and runs each
        step as the VD-EKF or LO-FI chain of kernels (docs/gpu.md); missing outputs and
        ``update_batch`` take the host route and come back to the GPU. "numba" (families "diag",
        "diag-moment", "dlr"; and "full", "full-moment" with algorithm "bong" or "bog" and estimator
        "lin-hess" or "lin-ef"; others raise ValueError here) gives the reference's numbers to
        round-off. Over the full families it is the reference's step with a compiled update pass:
        ``predict_update`` and ``scan`` write each new covariance in one compiled pass over the old one
        (``linalg.lowrank_update(compiled=True)``), and ``update`` and ``update_batch`` run as the
        reference does (docs/bong.md §7). For an MLP or an
        rb.Linear with a Gaussian or categorical likelihood and estimator "lin-hess" or "lin-ef",
        every algorithm runs a compiled MLP step per observation (predict, estimate without the
        C x P Jacobian, all inner iterations; ``compiled.fused_combinations()``); with "mc-ef"
        over "diag", "diag-moment" and "dlr" each inner iteration draws as the reference does and
        puts the M draws through the network in one compiled call (``compiled.mc_combinations()``);
        with "mc-hess" over "diag" and "diag-moment" (``hess_diag="hutchinson"``) each draw's
        gradient and Hessian-vector products come from one compiled call
        (``compiled.mc_hess_combinations()``). Every other case, and ``update_batch``, takes the
        general route: the estimator in NumPy (MC-HESS with ``hess_diag="exact"``; any other model
        or likelihood), with the inner steps, the DLR predict, the DLR sampler and an MLP's Jacobian
        compiled. docs/bong.md §6 lists what runs where.
    """

    backends = ("numpy", "numba", "cuda")
    #: NaN components of y are missing: every estimator conditions on the observed ones only
    #: (docs/streams.md §3)
    handles_missing = True

    @keyword_renamed("vdekf_mean", "vd_mean", convert=lambda v: "ekf" if v else "paper", check=_check_flag)
    def __init__(self, model: Model, likelihood: Likelihood, *, algorithm: str = "bong", family: str = "dlr",
                 estimator: str = "lin-hess", n_samples: int = 10, n_iter: int = 1, lr: float | None = None,
                 rank: int = 10, gamma: float = 1.0, q: ArrayLike = 0.0, dynamics: str = "standard",
                 ou_mean: ArrayLike | None = None, ou_var: ArrayLike | None = None,
                 rng: np.random.Generator | None = None, hess_diag: str = "hutchinson", n_probes: int = 100,
                 antithetic: bool = False, vd_mean: str = "paper", symmetrize: bool = True,
                 backend: str = "numpy") -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend)
        self.algorithm = _choice(algorithm, ALGORITHMS, "algorithm")
        #: the public family name (FAMILY_NAMES); ``_family`` is the identifier of ``families``
        self.family = public_family(family)
        self._family = internal_family(self.family)
        self.estimator = _choice(estimator, ESTIMATORS, "estimator")
        full = self._family in ("full", "full-natural")
        if self.backend != "numpy" and self._family not in compiled.KERNEL_FAMILIES and not (
                full and self.backend == "numba" and folds_predict(self.algorithm, self.estimator)):
            kernel_names = tuple(n for n in FAMILY_NAMES if internal_family(n) in compiled.KERNEL_FAMILIES)
            raise ValueError(f"backend={self.backend!r} supports family in {kernel_names}"
                             + (", and 'full' and 'full-moment' with algorithm 'bong' or 'bog' and estimator "
                                "'lin-hess' or 'lin-ef'" if self.backend == "numba" else "")
                             + f"; got family={self.family!r}, algorithm={self.algorithm!r}, "
                             f"estimator={self.estimator!r} (use backend='numpy')")
        if not supports(self._family, self.estimator):
            raise ValueError(
                "estimator='mc-hess' is undefined for family='dlr': the DLR updates need a low-rank "
                "curvature factor; use 'mc-ef', 'lin-hess' or 'lin-ef'"
            )
        self.n_iter = positive_int(n_iter, "n_iter")
        if self.algorithm in ("bong", "bog") and self.n_iter != 1:
            raise ValueError(f"n_iter must be 1 for algorithm={self.algorithm!r}; got {self.n_iter}")
        if lr is None:
            if self.algorithm != "bong":
                raise ValueError(f"lr is required for algorithm={self.algorithm!r}")
            lr = 1.0
        lr = positive_scalar(lr, "lr")
        if self.algorithm == "bong" and lr != 1.0:
            raise ValueError(f"BONG has no learning rate: lr must be None or 1; got {lr}")
        if self.algorithm == "blr" and self._family == "dlr" and lr > 1.0:
            raise ValueError(f"lr must be <= 1 for BLR with the DLR family; got {lr}")
        self.lr = lr
        self.rank = int_at_least(rank, "rank", 0) if self._family == "dlr" else None
        if self.rank is not None:
            self.rank = _rank_within(self.rank, model.n_params, "Bong(family='dlr')")
        self.n_samples = positive_int(n_samples, "n_samples")
        if self._family in ("full", "full-natural"):
            P, C = model.n_params, self.likelihood.obs_dim(model.out_dim)
            memory.require(f"Bong(family={self.family!r})", 2.0 * P * P + (C + self.n_samples) * P,
                           "two P x P matrices (the belief and the step's new one)", P, C)
        if not isinstance(antithetic, (bool, np.bool_)):
            raise TypeError(f"antithetic must be True or False; got {antithetic!r}")
        self.antithetic = bool(antithetic)
        if self.antithetic and self.n_samples % 2:
            raise ValueError(f"n_samples must be even with antithetic=True; got {self.n_samples}")
        self.hess_diag = _choice(hess_diag, HESS_DIAG_RULES, "hess_diag")
        self.n_probes = positive_int(n_probes, "n_probes")
        self.vd_mean = _choice(vd_mean, VD_MEAN_RULES, "vd_mean")
        if self.vd_mean == "ekf" and not (self.algorithm == "bong" and self._family == "diag-natural"
                                          and self.estimator != "mc-hess"):
            raise ValueError("vd_mean='ekf' applies only to algorithm='bong', family='diag' (natural) "
                             "with a factor estimator ('mc-ef', 'lin-hess', 'lin-ef')")
        self.vdekf_mean = self.vd_mean == "ekf"  # the inner step's flag
        if not isinstance(symmetrize, (bool, np.bool_)):
            raise TypeError(f"symmetrize must be True or False; got {symmetrize!r}")
        self.symmetrize = bool(symmetrize)
        self.rng = deprecated_stored_rng(rng, "Bong")
        self.dynamics = _choice(dynamics, DYNAMICS, "dynamics")
        self._b = None
        self._q_eff = self.q
        if self.dynamics == "ou":
            if np.any(np.asarray(self.q) != 0):
                raise ValueError("q must be 0 with dynamics='ou' (the process noise is (1 - gamma^2) ou_var)")
            if self.gamma > 1.0:
                raise ValueError(f"gamma must be <= 1 with dynamics='ou'; got {self.gamma}")
            if ou_mean is None or ou_var is None:
                raise ValueError("dynamics='ou' needs ou_mean (P,) and ou_var (scalar or (P,))")
            ou_mean = as_float_array(ou_mean, "ou_mean", shape=(self.n_params,))
            ou_var = positive_or_vector(ou_var, "ou_var", self.n_params)
            self._b, self._q_eff = ou_dynamics(self.gamma, ou_mean, ou_var)
        elif ou_mean is not None or ou_var is not None:
            raise ValueError("ou_mean and ou_var are only used with dynamics='ou'")
        self.belief_type = BELIEF_TYPES[self._family]
        if self.backend == "numpy" or full:  # full families: the reference's steps (see full_one_step)
            step = get_step(self.algorithm, self._family)
        else:
            step = compiled.get_kernel_step(self.algorithm, self._family)
        extra = {}
        if self.vdekf_mean:
            extra["vdekf_mean"] = True
        if self._family == "full-natural" and self.algorithm in ("bog", "bbb"):
            extra["symmetrize"] = self.symmetrize
        self._step_fn = step
        self._step_kw = extra
        self._fused_spec = compiled.fused_spec(self)
        self._device_spec = self._check_cuda() if self.backend == "cuda" else None

    def _check_cuda(self):
        """The GPU step's arguments (base.mlp_kernel_spec) for backend "cuda", which runs BONG with LIN-HESS
        over "diag" (natural; the VD-EKF chain, kernels.cuda.diag_step) and "dlr" (the LO-FI chain,
        kernels.cuda.step) on an MLP or rb.Linear with a Gaussian or categorical likelihood, standard
        dynamics; a ValueError for anything else."""
        from ..base import mlp_kernel_spec

        combo = (self.algorithm, self._family, self.estimator)
        if combo not in (("bong", "diag-natural", "lin-hess"), ("bong", "dlr", "lin-hess")) or self.dynamics != "standard":
            raise ValueError("backend='cuda' runs Bong(algorithm='bong', estimator='lin-hess') over family 'diag' or "
                             f"'dlr' with dynamics='standard'; got algorithm={self.algorithm!r}, family={self.family!r}, "
                             f"estimator={self.estimator!r}, dynamics={self.dynamics!r} (use backend='numba')")
        spec = mlp_kernel_spec(self.model, self.likelihood)
        if spec is None:
            raise ValueError("backend='cuda' runs Bong on an rb.MLP or rb.Linear with a Gaussian or categorical "
                             f"likelihood; got {type(self.model).__name__} with {type(self.likelihood).__name__} "
                             "(use backend='numba')")
        return spec

    def _placed(self, new, bel):
        """``new`` back on the GPU when ``bel`` was there (a step that took the host route)."""
        if getattr(bel, "device_mean", None) is not None and getattr(new, "device_mean", None) is None:
            return self._on_device(new)
        return new

    # -- construction from names -----------------------------------------------------------------
    @classmethod
    def from_name(cls, model: Model, likelihood: Likelihood, name: str, **kwargs: Any) -> Bong:
        """Build from a legend or short name (see refbayes.filters.bong.names); kwargs add options."""
        opts = parse_name(name)
        for key in kwargs:
            if key in opts and kwargs[key] != opts[key]:
                raise ValueError(f"{key}={kwargs[key]!r} contradicts name {name!r} ({key}={opts[key]!r})")
        opts.update(kwargs)
        return cls(model, likelihood, **opts)

    @property
    def name(self) -> str:
        """The legend name, e.g. 'bong-dlr10-hess_lin'."""
        return format_name(self.algorithm, self.family, self.estimator, rank=self.rank,
                           n_samples=self.n_samples if self.estimator.startswith("mc") else None)

    # -- beliefs ---------------------------------------------------------------------------------
    def _thread_size(self):
        """The thread policy's size of a step: P^2 for the full families on backend "numba" (the
        entries of their compiled update pass, on the kernel threads from ``cholupdate.COPY_FIRST_P``
        on), else P (docs/threads.md)."""
        P = self.model.n_params
        return P * P if self.backend == "numba" and self._family in ("full", "full-natural") else P

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> FullCov | Diag | DLR:
        """Prior N(mean, diag(prior_var)) as FullCov, Diag or DLR (ups = 1/prior_var, W = 0 (P, rank))."""
        mean, var = self._init_mean_var(mean, prior_var)
        bel = init_belief(self._family, mean, var, self.rank or 0)
        if self._device_spec is not None:
            return self._on_device(bel)
        return bel

    def _check_belief(self, bel):
        super()._check_belief(bel)
        if self._family == "dlr" and bel.rank != self.rank:
            raise ValueError(f"bel must have rank {self.rank}; got {bel.rank}")

    def _predict(self, bel):
        if getattr(bel, "device_mean", None) is not None:  # on the GPU: the LO-FI or diagonal predict there
            from ...device import predict_on_device

            return predict_on_device(self, bel)
        if self.backend != "numpy" and self._family == "dlr":
            return compiled.predict_dlr(bel, self.gamma, self._q_eff, self._b)
        return predict(self._family, bel, self.gamma, self._q_eff, self._b)

    # -- update ----------------------------------------------------------------------------------
    @property
    def needs_rng(self) -> bool:
        """True when updates draw random numbers (MC estimators)."""
        return self.estimator.startswith("mc")

    def _resolve_rng(self, rng):
        if rng is None:
            rng = self.rng
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
        if rng is None and self.needs_rng:
            raise TypeError(
                f"estimator={self.estimator!r} draws samples: pass rng=np.random.default_rng(...) "
                "to update, update_batch, predict_update or scan"
            )
        return rng

    def _check_y(self, y):
        """(whether y has missing components, whether any component is observed), after checking
        y as the likelihood takes it (NaN components filled with placeholders)."""
        if not self._check_missing(y):
            self.likelihood.encode(y, self.model.out_dim)
            return False, True
        filled, observed = split_missing(self.likelihood, y, self.model.out_dim)
        self.likelihood.encode(filled, self.model.out_dim)
        return True, bool(observed.any())

    def estimate(self, bel: FullCov | Diag | DLR, xs: Sequence[ArrayLike], ys: Sequence[ArrayLike],
                 rng: np.random.Generator | None = None) -> Estimate:
        """(g, curvature) at belief ``bel`` for the observations xs, ys (sequences). Returns an Estimate."""
        curvature = "dense"
        if self._family in ("diag", "diag-natural"):
            curvature = "hutchinson" if self.hess_diag == "hutchinson" else "exact-diag"
        sampler = compiled.dlr_sampler if self.backend != "numpy" and self._family == "dlr" else None
        return est_mod.estimate(self.estimator, self.model, self.likelihood, bel, xs, ys, rng=rng,
                                n_samples=self.n_samples, hess_curvature=curvature,
                                n_probes=self.n_probes, antithetic=self.antithetic,
                                value_and_jacobian=self._value_and_jacobian(), sampler=sampler,
                                fast=self.backend != "numpy")

    def step(self, cur: FullCov | Diag | DLR, prior: FullCov | Diag | DLR, estimate: Estimate) -> FullCov | Diag | DLR:
        """One inner iteration from ``cur`` given the predicted belief ``prior`` and an Estimate.

        A non-finite gradient or curvature estimate raises DivergenceError on every backend."""
        if not (np.all(np.isfinite(estimate.g)) and np.all(np.isfinite(estimate.curvature.data))):
            raise DivergenceError("the gradient or curvature estimate is not finite: the filter has diverged",
                                  quantity="estimate")
        if self.backend != "numpy":
            return self._step_fn(cur, prior, estimate.g, estimate.curvature, self.lr, coef=estimate.coef,
                                 **self._step_kw)
        return self._step_fn(cur, prior, estimate.g, estimate.curvature, self.lr, **self._step_kw)

    def _run(self, prior, xs, ys, rng):
        cur = prior
        for k in range(self.n_iter):
            with inner_iteration(k, self.n_iter):
                cur = self.step(cur, prior, self.estimate(cur, xs, ys, rng))
        return cur

    def _fused_step(self, bel, x, y, predict=False, rng=None):
        """(belief, yhat) from the compiled MLP step (``compiled.fused_step``; ``predict``: the predict
        step too; ``rng``: the resolved Generator of an MC estimator), or None to take the general
        route. Full families with BONG/BOG and a LIN estimator fold the predict step into the update
        (``algorithms.full_one_step``; with backend "numba" its new covariance is written by the
        compiled pass, ``linalg.lowrank_update(compiled=True)``)."""
        if self._device_spec is not None:
            return self._device_step(bel, x, y, predict)
        if predict and self._fused_spec is None:
            return full_one_step(self, bel, x, y)
        return None if self._fused_spec is None else compiled.fused_step(self, bel, x, y, predict, rng=rng)

    def update(self, bel: FullCov | Diag | DLR, x: ArrayLike, y: ArrayLike, *, obs_var: ArrayLike | None = None,
               rng: np.random.Generator | None = None) -> FullCov | Diag | DLR:
        """Condition on one observation (x, y); ``bel`` is the predicted belief. Returns a new belief.

        NaN components of y are missing: the estimators use the observed outputs only (the
        linearisation's observed rows; the observed outputs' log-likelihood for MC), and with
        nothing observed (all NaN, or a NaN class label) ``bel`` itself is returned.
        obs_var: this observation's Gaussian noise where it differs (see ``with_noise``).
        rng: numpy.random.Generator for the Monte Carlo estimators.
        """
        if obs_var is not None:
            return self.with_noise(obs_var=obs_var).update(bel, x, y, rng=rng)
        self._check_belief(bel)
        x = self.model.validate_x(x)
        missing, observed = self._check_y(y)
        rng = self._resolve_rng(rng)
        if not observed:
            return bel
        out = None if missing else self._fused_step(bel, x, y, rng=rng)
        new = self._placed(self._run(bel, [x], [y], rng), bel) if out is None else out[0]
        check_belief_finite(new)
        return new

    def update_batch(self, bel: FullCov | Diag | DLR, X: ArrayLike, Y: ArrayLike, *,
                     rng: np.random.Generator | None = None) -> FullCov | Diag | DLR:
        """Condition on N observations as one (summed log-likelihood; a minibatch step).

        NaN components of Y are missing, as in ``update``; with nothing observed ``bel`` is returned."""
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        rng = self._resolve_rng(rng)
        if nothing_observed(self.likelihood, Y, self.model.out_dim):
            return bel
        return self._placed(self._run(bel, list(X), list(Y), rng), bel)

    def _update(self, bel, lin):
        if self.estimator.startswith("lin") and self.n_iter == 1:
            est = lin_from_linearization(lin, ef=self.estimator == "lin-ef", fast=self.backend != "numpy")
            return self.step(bel, bel, est)
        raise NotImplementedError(
            f"{self.name} needs the observation itself (sampling or re-linearising); use update(bel, x, y)"
        )

    def _step(self, bel, x, y, rng=None):
        rng = self._resolve_rng(rng)
        missing = has_missing(y)
        out = None if missing else self._fused_step(bel, x, y, rng=rng)
        if out is not None:
            return out
        yhat = self.likelihood.mean(self.model.apply(bel.mean, x))
        if missing and nothing_observed(self.likelihood, [y], self.model.out_dim):
            return bel, yhat
        return self._placed(self._run(bel, [x], [y], rng), bel), yhat

    def _device_step(self, bel, x, y, predict):
        """(belief on the GPU, yhat) of the GPU chain (refbayes.device.step_on_device): BONG with LIN-HESS over
        "diag" is the VD-EKF step (Jones et al. 2024, eqs 214-215; the paper's mean, or vd_mean="ekf"), over
        "dlr" the LO-FI step (eqs 281-292); or None to take the host route (missing outputs; LO-FI's one-Gram
        guard)."""
        from ...beliefs import DLR, Diag
        from ...device import step_on_device

        if has_missing(y) or not (type(bel) in (DLR, Diag) or getattr(bel, "device_mean", None) is not None):
            return None
        return step_on_device(self, self._device_spec, bel, x, y, predict, rank=self.rank,
                              mode="vd-ekf" if self.vdekf_mean else "vd-paper")

    def _predict_step(self, bel, x, y, rng=None):
        resolved = self._resolve_rng(rng)
        out = None if has_missing(y) else self._fused_step(bel, x, y, predict=True, rng=resolved)
        return self._step(self._predict(bel), x, y, rng=rng) if out is None else out

    def __repr__(self):
        return (f"Bong({self.name!r}, algorithm={self.algorithm!r}, family={self.family!r}, "
                f"estimator={self.estimator!r}, n_iter={self.n_iter}, lr={self.lr}, gamma={self.gamma}, q={self.q}"
                f"{self._repr_tail()})")
