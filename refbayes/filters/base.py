"""What every filter shares: linearisation, input checks, scan and predictives.

A filter object binds a model, a likelihood and hyper-parameters. The
mathematics lives in pure functions in the sibling modules; the classes only
check input, linearise the model and call them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import predictive
from .._progress import Progress
from .._validate import as_float_array, positive_or_vector, positive_scalar
from ..errors import DivergenceError, NotPositiveDefiniteError

if TYPE_CHECKING:
    from ..beliefs import Belief
    from ..likelihoods import Likelihood
    from ..models import Model
    from ..results import InnovationMonitor, ScanResult, StepResult
    from .replay import ReplayBelief

__all__ = ["Linearization", "linearize", "linearize_batch", "has_missing", "split_missing", "check_belief_finite", "mlp_kernel_spec", "Filter", "BACKENDS"]

BACKENDS = ("numpy", "numba", "cuda")


@dataclass(frozen=True)
class Linearization:
    """The model linearised at a parameter vector for one (or a stacked batch of) observation(s).

    eta (C_f,): model output; J (C_f, P): its Jacobian; yhat (C,): EKF mean
    m(theta); H (C, P): dm/dtheta; R (C, C): observation covariance; e (C,):
    residual T(y) - yhat; singular: R is singular by construction, so solves
    use a pseudo-inverse; inputs / targets: the checked x and encoded T(y) of
    each observation (tuples). For a stacked batch of N observations eta and J
    are (N, C_f) and (N, C_f, P), and H, R, e stack N blocks.
    """

    eta: np.ndarray
    J: np.ndarray
    yhat: np.ndarray
    H: np.ndarray
    R: np.ndarray
    e: np.ndarray
    singular: bool = False
    inputs: tuple = ()
    targets: tuple = ()
    observed: np.ndarray = None

    @property
    def n_observed(self) -> int:
        """How many components of T(y) the update conditions on (all, unless some were missing)."""
        return self.e.shape[0]


def linearize(model: Model, likelihood: Likelihood, theta: NDArray[np.float64], x: ArrayLike, y: ArrayLike,
              value_and_jacobian: Callable[[Any, Any], tuple[Any, Any]] | None = None) -> Linearization:
    """Linearise m(theta) = likelihood.mean(model(theta, x)) at theta (Chang et al. 2022, eqs 5-6).

    value_and_jacobian: optional replacement for ``model.value_and_jacobian``
    (e.g. a compiled MLP kernel); same arguments and outputs.
    """
    y, observed = split_missing(likelihood, y, model.out_dim)
    target = likelihood.encode(y, model.out_dim)
    x = model.validate_x(x)
    eta, J = (value_and_jacobian or model.value_and_jacobian)(theta, x)
    if not (np.all(np.isfinite(eta)) and np.all(np.isfinite(J))):
        raise DivergenceError("the model output or its Jacobian at the current mean is not finite: "
                              f"the filter has diverged (max |theta| = {np.abs(theta).max():.3g})",
                              quantity="model output")
    with np.errstate(over="ignore", invalid="ignore"):
        yhat = likelihood.mean(eta)
        H = likelihood.mean_jacobian(eta) @ J
        R = likelihood.cov(eta)
    for name, value in (("mean", yhat), ("covariance", R), ("mean Jacobian", H)):
        if not np.all(np.isfinite(value)):
            raise DivergenceError(
                f"the likelihood's {name} at the model output is not finite (max |eta| = "
                f"{np.abs(eta).max():.3g}; {type(likelihood).__name__}): the filter has diverged",
                quantity=f"likelihood {name}")
    if observed is None:
        return Linearization(eta, J, yhat, H, R, target - yhat, bool(likelihood.singular), (x,), (target,))
    # condition on the observed components only: rows of H and e, the matching block of R
    e = (target - yhat)[observed]
    R_obs = R[np.ix_(observed, observed)]
    singular = bool(likelihood.singular) and observed.all()
    return Linearization(eta, J, yhat, H[observed], R_obs, e, singular, (x,), (target,), observed)


def has_missing(y: Any) -> bool:
    """Whether an observation y holds NaN components (missing outputs or a missing label)."""
    if isinstance(y, (int, np.integer)):
        return False
    if isinstance(y, float):
        return y != y
    arr = np.asarray(y)
    return arr.dtype.kind == "f" and bool(np.isnan(arr).any())


def split_missing(likelihood: Likelihood, y: Any, out_dim: int) -> tuple[Any, NDArray[np.bool_] | None]:
    """(y with its missing components filled in, boolean mask over T(y)) or (y, None).

    NaN components of y are not observed. For Gaussian, Poisson and Bernoulli outputs the
    mask is per output; a NaN class label (Categorical) leaves nothing observed. Filled
    entries are placeholders that pass the likelihood's checks and are never used. Inf is
    not missing: it stays an error of ``likelihood.encode``.
    """
    if not has_missing(y):
        return y, None
    C = likelihood.obs_dim(out_dim)
    if type(likelihood).__name__ == "Categorical":
        return 0, np.zeros(C, dtype=bool)
    arr = np.asarray(y, dtype=np.float64)
    missing = np.isnan(arr)
    if arr.size != C:
        raise ValueError(f"y must have {C} components; got shape {arr.shape}")
    return np.where(missing, 0.0, arr), ~missing.reshape(C)


def require_finite(what: str, *arrays: np.ndarray) -> None:
    """Raise DivergenceError (quantity ``what``) if any of ``arrays`` holds NaN or inf: a step's
    intermediate or output that left the floating-point range from finite inputs."""
    for a in arrays:
        if not np.all(np.isfinite(a)):
            raise DivergenceError(f"{what} produced non-finite values (overflow or an ill-posed prior)", quantity=what)


def check_belief_finite(bel: Belief | ReplayBelief) -> None:
    """Raise DivergenceError if a new belief's mean or variance factors are not finite.

    Every array field of the belief is checked, except that of a P x P matrix only the
    diagonal is read (a full pass would cost as much as the step itself).
    """
    import dataclasses

    if bel.__dict__.get("_kernel_checked"):  # from a step that checked its outputs (a compiled one, full_belief_fast)
        return
    for field in dataclasses.fields(bel):
        value = getattr(bel, field.name)
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
            continue
        if value.ndim == 2 and value.shape[0] == value.shape[1] and value.shape[0] > 64:
            value = np.diagonal(value)
        if not np.all(np.isfinite(value)):
            raise DivergenceError(f"the new belief's {field.name} is not finite: the filter has diverged",
                                  quantity=f"belief {field.name}")


def linearize_batch(model: Model, likelihood: Likelihood, theta: NDArray[np.float64], X: ArrayLike, Y: ArrayLike,
                    value_and_jacobian: Callable[[Any, Any], tuple[Any, Any]] | None = None) -> Linearization:
    """Stack the linearisations of N observations: H (N C, P), block-diagonal R, e (N C,).

    Conditioning on the stacked observation is the same as conditioning on
    each one in turn when the model is linear (a minibatch update).
    """
    lins = [linearize(model, likelihood, theta, x, y, value_and_jacobian) for x, y in zip(X, Y)]
    C = lins[0].yhat.shape[0]
    R = np.zeros((len(lins) * C, len(lins) * C))
    for i, lin in enumerate(lins):
        R[i * C:(i + 1) * C, i * C:(i + 1) * C] = lin.R
    return Linearization(
        np.stack([lin.eta for lin in lins]),
        np.stack([lin.J for lin in lins]),
        np.concatenate([lin.yhat for lin in lins]),
        np.concatenate([lin.H for lin in lins]),
        R,
        np.concatenate([lin.e for lin in lins]),
        lins[0].singular,
        sum((lin.inputs for lin in lins), ()),
        sum((lin.targets for lin in lins), ()),
    )


def mlp_kernel_spec(model, likelihood):
    """Arguments (sizes, activation code, likelihood code, Rc, jitter) of the compiled one-call MLP
    steps (``refbayes.kernels.cpu.step`` and ``.mlp_diag``) for an MLP, or a ``Linear`` (the
    parameter layout of an MLP with no hidden layer; without bias the kernels read it from P),
    with a Gaussian or categorical likelihood; None where they do not apply. Rc is the Gaussian
    noise covariance (C, C)."""
    from ..likelihoods import Categorical, Gaussian
    from ..models import MLP, Linear

    if isinstance(model, Linear):
        # theta = [vec(W) (C order), b] or vec(W): an MLP with no hidden layer, with or without bias
        sizes, act = np.array([model.in_dim, model.out_dim], dtype=np.int64), "linear"
    elif isinstance(model, MLP):
        sizes, act = np.asarray(model.layer_sizes, dtype=np.int64), str(model.activation).lower()
    else:
        return None
    from ..kernels.cpu.mlp import ACTIVATION_CODES

    act = ACTIVATION_CODES.get(act)
    if act is None:
        return None
    if isinstance(likelihood, Gaussian):
        Rc = np.ascontiguousarray(likelihood.cov(np.zeros(model.out_dim)), dtype=np.float64)
        return sizes, act, 0, Rc, 0.0
    if isinstance(likelihood, Categorical):
        return sizes, act, 1 if likelihood.mode == "drop_last" else 2, np.zeros((1, 1)), float(likelihood.jitter)
    return None


def _require_cuda():
    """Raise a clear error unless a CUDA GPU (or numba's CUDA simulator) can run the kernels."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return
    try:
        from numba import cuda

        ok = cuda.is_available()
    except Exception as exc:  # numba-cuda missing or broken
        raise RuntimeError(f'backend="cuda" needs numba-cuda and an NVIDIA GPU ({exc}); install with '
                           'pip install "refbayes[cuda]", or use backend="numba" on a CPU') from exc
    if not ok:
        raise RuntimeError('backend="cuda" needs an NVIDIA GPU with a working driver, and none was found; '
                           'use backend="numba" on a CPU (or set NUMBA_ENABLE_CUDASIM=1 to run the CUDA '
                           'kernels in numba\'s simulator, slowly)')


class Filter:
    """Base class of the recursive Gaussian filters.

    Dynamics: theta_t = gamma * theta_{t-1} + N(0, diag(q)). Subclasses set
    ``belief_type`` and implement ``init``, ``_predict`` and ``_update``.
    """

    belief_type = None
    backends = ("numpy",)
    #: the backends on which this filter keeps float32 beliefs (``dtype=np.float32``)
    float32_backends = ()
    #: whether the update conditions on the observed components of y when some are NaN
    #: (filters whose update uses only the linearisation's H, R and e)
    handles_missing = False

    def __init_subclass__(cls, **kwargs):
        # every public step runs under the thread policy of refbayes.threads (docs/threads.md)
        super().__init_subclass__(**kwargs)
        from ..threads import wrap_step

        for name in ("predict", "update", "predict_update", "update_batch", "scan", "predict_obs"):
            method = getattr(cls, name, None)
            if method is not None and not getattr(method, "__refbayes_threads__", False):
                setattr(cls, name, wrap_step(method))

    def __init__(self, model: Model, likelihood: Likelihood, *, gamma: float = 1.0, q: ArrayLike = 0.0,
                 backend: str = "numpy", dtype: Any = np.float64) -> None:
        for attr in ("n_params", "out_dim", "apply", "jacobian"):
            if not hasattr(model, attr):
                raise TypeError(f"model must be a refbayes model (missing {attr!r}); got {type(model).__name__}")
        for attr in ("mean", "cov", "encode", "mean_jacobian"):
            if not hasattr(likelihood, attr):
                raise TypeError(f"likelihood must be a refbayes likelihood (missing {attr!r}); got {type(likelihood).__name__}")
        likelihood.check_out_dim(model.out_dim)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if backend not in self.backends:
            raise ValueError(f"{type(self).__name__} supports backend in {self.backends}; got {backend!r}")
        if backend == "cuda":
            _require_cuda()
        self.model = model
        self.likelihood = likelihood
        self.gamma = self._check_gamma(gamma)
        self.q = self._check_q(q, model.n_params)
        self.backend = backend
        self.dtype = self._check_dtype(dtype, backend)

    def _thread_size(self) -> int:
        """The size that the thread policy (refbayes.threads.plan) weighs this filter's steps by: the
        number of parameters, for steps whose passes run over P numbers."""
        return self.model.n_params

    @classmethod
    def _check_dtype(cls, dtype, backend):
        """dtype as np.dtype: float64, or float32 where this filter has a float32 path on ``backend``."""
        from ..beliefs import storage_dtype

        dt = storage_dtype(dtype)
        if dt == np.float32 and backend not in cls.float32_backends:
            if not cls.float32_backends:
                raise ValueError(f"{cls.__name__} has no float32 beliefs (dtype=np.float32 is available for LoFi, "
                                 "FDEKF and VDEKF with backend='numba' or 'cuda')")
            raise ValueError(f"{cls.__name__}(dtype=np.float32) needs backend in {cls.float32_backends}; got "
                             f"backend={backend!r} (the NumPy reference computes and stores float64)")
        return dt

    @staticmethod
    def _on_device(bel):
        """``bel`` (a DLR or Diag) on the GPU, for the GPU steps (backend "cuda"; refbayes.device.to_device)."""
        from ..device import to_device

        return to_device(bel)

    def _device_q(self):
        """For the GPU steps (backend "cuda"): (q scalar, None), or (0, q on the GPU) for a (P,) q (copied
        once per q array)."""
        if np.ndim(self.q) == 0:
            return float(self.q), None
        cached = self.__dict__.get("_dq")
        if cached is None or cached[0] is not self.q:
            from ..kernels.cuda.step import to_device

            cached = (self.q, to_device(np.ascontiguousarray(self.q, dtype=np.float64)))
            self.__dict__["_dq"] = cached
        return 0.0, cached[1]

    @staticmethod
    def _check_gamma(gamma):
        gamma = positive_scalar(gamma, "gamma")
        if gamma > 1.0:
            raise ValueError(f"gamma must be in (0, 1] (the dynamics theta_t = gamma theta_(t-1) + noise "
                             f"shrink towards zero); got {gamma}")
        return gamma

    @staticmethod
    def _check_q(q, n_params):
        q_arr = as_float_array(q, "q")
        out = float(q_arr) if q_arr.ndim == 0 else positive_or_vector(q_arr, "q", n_params, allow_zero=True)
        if np.any(np.asarray(out) < 0):
            raise ValueError(f"q must be >= 0; got {q}")
        return out

    def with_noise(self, *, gamma: float | None = None, q: ArrayLike | None = None,
                   obs_var: ArrayLike | None = None) -> Filter:
        """This filter with other dynamics or observation noise (a new filter; this one is unchanged).

        gamma: in (0, 1]; q: a scalar or a (P,) vector >= 0; obs_var: the Gaussian likelihood's
        noise, a scalar, a (C,) vector or a (C, C) matrix (other likelihoods have no noise to
        set). Arguments left as None keep their values. For noise that changes with time,
        ``filt.with_noise(obs_var=r_t).update(bel, x, y)``, or per-step arrays to ``scan``.
        """
        if gamma is None and q is None and obs_var is None:
            return self
        new = copy.copy(self)
        if gamma is not None:
            new.gamma = self._check_gamma(gamma)
        if q is not None:
            new.q = self._check_q(q, self.n_params)
        if obs_var is not None:
            from ..likelihoods import Gaussian

            if not isinstance(self.likelihood, Gaussian):
                raise ValueError(f"obs_var applies to a Gaussian likelihood; this filter's is "
                                 f"{type(self.likelihood).__name__}")
            lik = Gaussian(obs_var, jitter=self.likelihood.jitter)
            lik.check_out_dim(self.model.out_dim)
            new.likelihood = lik
            new.__dict__.pop("_mlp_spec", None)  # compiled-step arguments that hold the noise
            new.__dict__.pop("_dspec", None)
            if getattr(new, "_fused_spec", None) is not None:
                new._fused_spec = mlp_kernel_spec(new.model, lik)
        return new

    @property
    def kernels(self) -> ModuleType | None:
        """The kernel module of ``backend`` (refbayes.kernels.cpu or .cuda); None for "numpy".

        Imported on first use, so the NumPy reference never loads Numba's compiler.
        """
        if self.backend == "numpy":
            return None
        mod = self.__dict__.get("_kernel_module")
        if mod is None:
            from .. import kernels

            mod = self.__dict__["_kernel_module"] = kernels.backend(self.backend)
        return mod

    def _value_and_jacobian(self):
        """The model's output-and-Jacobian function for this backend (a compiled one for MLPs)."""
        from ..models import MLP

        if self.backend == "numpy" or not isinstance(self.model, MLP):
            return None
        from ..kernels import cpu

        return lambda theta, x: cpu.mlp_value_and_jacobian(self.model, theta, x)

    # -- shapes and checks -------------------------------------------------
    @property
    def n_params(self) -> int:
        """P, the number of model parameters: the length of every belief's ``mean``."""
        return self.model.n_params

    def _check_belief(self, bel):
        if not isinstance(bel, self.belief_type):
            raise TypeError(f"bel must be a {self.belief_type.__name__}; got {type(bel).__name__}")
        if bel.n_params != self.n_params:
            raise ValueError(f"bel must have {self.n_params} parameters; got {bel.n_params}")
        dtype = getattr(bel, "dtype", np.dtype(np.float64))
        if dtype != getattr(self, "dtype", np.dtype(np.float64)):
            raise ValueError(f"bel is a {dtype} belief and this {type(self).__name__} keeps {self.dtype} beliefs; "
                             f"convert it with bel.astype(np.{self.dtype}), or build the filter with "
                             f"dtype=np.{dtype}")

    def _init_mean_var(self, mean, prior_var):
        mean = as_float_array(mean, "mean", shape=(self.n_params,))
        var = positive_or_vector(prior_var, "prior_var", self.n_params)
        return mean, var

    # -- public API --------------------------------------------------------
    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> Belief | ReplayBelief:
        """Prior belief N(mean, prior_var I); prior_var may be a (P,) vector."""
        raise NotImplementedError

    def predict(self, bel: Belief | ReplayBelief, *, gamma: float | None = None, q: ArrayLike | None = None) -> Belief | ReplayBelief:
        """Dynamics step: theta_t = gamma theta_{t-1} + N(0, q I). Returns a new belief.

        gamma, q: this step's values where they differ from the filter's (see ``with_noise``).
        """
        self._check_belief(bel)
        return self.with_noise(gamma=gamma, q=q)._predict(bel)

    def linearize(self, bel: Belief | ReplayBelief, x: ArrayLike, y: ArrayLike) -> Linearization:
        """Linearise the model at ``bel.mean`` for the observation (x, y)."""
        self._check_belief(bel)
        return linearize(self.model, self.likelihood, bel.mean, x, y, self._value_and_jacobian())

    def update(self, bel: Belief | ReplayBelief, x: ArrayLike, y: ArrayLike, *, obs_var: ArrayLike | None = None) -> Belief | ReplayBelief:
        """Condition on one observation (x, y). Returns a new belief; ``bel`` is untouched.

        x: (in_dim,); y: as the likelihood takes it (NaN components are missing: see
        ``handles_missing``). obs_var: this observation's Gaussian noise where it differs from
        the likelihood's (see ``with_noise``). Raises DivergenceError (naming the quantity) if
        the model, the likelihood or the new belief leaves the finite range.
        """
        if obs_var is not None:
            return self.with_noise(obs_var=obs_var).update(bel, x, y)
        missing = self._check_missing(y)
        if self.kernels is not None and not missing:
            self._check_belief(bel)
            out = self._fused_step(bel, x, y)
            if out is not None:
                check_belief_finite(out[0])
                return out[0]
        new = self._update_observed(bel, self.linearize(bel, x, y))
        check_belief_finite(new)
        return new

    def _check_missing(self, y):
        """Whether y has missing (NaN) components; a ValueError if this filter cannot skip them."""
        if not has_missing(y):
            return False
        if not self.handles_missing:
            raise ValueError(f"y contains NaN (missing components), which {type(self).__name__} does not "
                             "handle; the EKFs, LoFi (non-adaptive), Bong, RVGA, the logistic filters and "
                             "SubspaceEKF condition on the observed components only (docs/streams.md)")
        return True

    def _update_observed(self, bel, lin):
        """``_update`` on the observed components; a belief with nothing observed is returned as it is."""
        if lin.observed is not None and not lin.observed.any():
            return bel
        return self._update(bel, lin)

    def _fused_step(self, bel, x, y, predict=False):
        """(posterior, yhat) of a compiled one-call step (``predict``: the predict step too), or None
        to take the general route. None here; filters with such a step override it. ``bel`` has
        been checked; x and y not yet."""
        return None

    def predict_update(self, bel: Belief | ReplayBelief, x: ArrayLike, y: ArrayLike, *, gamma: float | None = None,
                       q: ArrayLike | None = None, obs_var: ArrayLike | None = None, **options: Any) -> Belief | ReplayBelief:
        """One filtering step: predict, then condition on (x, y). Returns the posterior belief.

        The numbers of ``update(predict(bel), x, y)``; a compiled backend may run both in
        one call (``LoFi`` with backend="numba" on an MLP). gamma, q, obs_var: this step's
        noise where it differs from the filter's (see ``with_noise``). ``options`` as for ``scan``.
        """
        self._check_belief(bel)
        filt = self.with_noise(gamma=gamma, q=q, obs_var=obs_var)
        new = filt._predict_step(bel, x, y, **options)[0]
        check_belief_finite(new)
        return new

    def update_batch(self, bel: Belief | ReplayBelief, X: ArrayLike, Y: ArrayLike) -> Belief | ReplayBelief:
        """Condition on N observations at once by stacking them (a minibatch step)."""
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        return self._update(bel, linearize_batch(self.model, self.likelihood, bel.mean, X, Y, self._value_and_jacobian()))

    def _check_stream(self, X, Y):
        if isinstance(X, (bool, np.bool_)) or getattr(np.asarray(X), "dtype", None) == np.bool_:
            raise TypeError("X must hold numbers, not booleans (convert with X.astype(float))")
        X = as_float_array(X, "X")
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2:
            raise ValueError(f"X must have shape (T, in_dim); got {X.shape}")
        if isinstance(Y, (str, bytes)) or not hasattr(Y, "__len__") or np.ndim(Y) == 0:
            raise TypeError(f"Y must be a sequence of {X.shape[0]} observations (an array with one row per "
                            f"row of X); got {type(Y).__name__}")
        if len(Y) != X.shape[0]:
            raise ValueError(f"Y must have {X.shape[0]} entries to match X; got {len(Y)}")
        for t in range(X.shape[0]):  # fail before any state changes
            self.model.validate_x(X[t])
            y = Y[t]
            if self._check_missing(y):
                y = split_missing(self.likelihood, y, self.model.out_dim)[0]
            self.likelihood.encode(y, self.model.out_dim)
        return X, Y

    def _step(self, bel, x, y, **options):
        """Condition ``bel`` on one observation inside ``scan``; returns (belief, yhat).

        Filters whose update needs more than the linearisation (sampling,
        replay buffers) override this; ``options`` are scan's extra keywords.
        """
        fused = self.kernels is not None and not options and not self._check_missing(y)
        out = self._fused_step(bel, x, y) if fused else None
        if out is not None:
            return out
        lin = self.linearize(bel, x, y)
        return self._update_observed(bel, lin), lin.yhat

    def _predict_step(self, bel, x, y, **options):
        """Predict then ``_step``: (posterior, yhat at the predicted mean), in one compiled call
        where ``_fused_step`` offers one (``bel`` has been checked)."""
        fused = self.kernels is not None and not options and not self._check_missing(y)
        out = self._fused_step(bel, x, y, predict=True) if fused else None
        return self._step(self._predict(bel), x, y, **options) if out is None else out

    def _per_step(self, T, gamma, q, obs_var):
        """The filter of each of T steps for per-step gamma (T,), q (T,) or (T, P) and obs_var
        (T,), (T, C) or (T, C, C); a scalar is the same at every step. None: one filter for all."""
        series = {}
        for name, value in (("gamma", gamma), ("q", q), ("obs_var", obs_var)):
            if value is None:
                continue
            arr = as_float_array(value, name)
            if arr.ndim == 0:
                series[name] = [float(arr)] * T
            elif arr.shape[0] != T:
                raise ValueError(f"{name} must be a scalar or hold one value per step (leading axis {T}); "
                                 f"got shape {arr.shape}")
            else:
                series[name] = list(arr)
        if not series:
            return None
        return [self.with_noise(**{name: values[t] for name, values in series.items()}) for t in range(T)]

    def scan(self, bel: Belief | ReplayBelief, X: ArrayLike, Y: ArrayLike, callback: Callable[..., Any] | None = None, *,
             predictive: str = "plugin", on_step: Callable[[int, StepResult], Any] | None = None,
             keep_mean: bool = False, keep_var: bool = False, monitor: InnovationMonitor | None = None,
             gamma: ArrayLike | None = None, q: ArrayLike | None = None, obs_var: ArrayLike | None = None,
             progress: bool = False, **options: Any) -> tuple[Belief | ReplayBelief, ScanResult]:
        """Run predict + update over a stream of T observations.

        X (T, in_dim) and Y (T observations, each as ``update`` takes it) are checked in
        full before the first step. Returns ``(belief, result)``: the final belief and a
        :class:`refbayes.results.ScanResult` with, stacked over the steps, the one-step-ahead
        mean ``yhat`` (T, C), the predictive of y for every output ``pred_mean`` (T, K) and
        ``pred_cov`` (T, K, K), the log predictive density ``log_pred`` (T,) and its running
        sum ``log_evidence`` (T,), the step times ``seconds`` (T,), and when asked for the
        filtered ``means`` (T, P) and marginal ``variances`` (T, P).

        predictive: "plugin" (default; from the step's own yhat, free) or "linearized" (the
            model linearised at the predicted mean, cov H Sigma H^T + R; for a linear-Gaussian
            model its log_evidence is the exact log marginal likelihood).
        on_step: optional ``on_step(t, step)`` called after each step with a
            :class:`refbayes.results.StepResult` (posterior belief, yhat, predictive, log
            density); compiled one-call steps stay in use. Its return values are
            ``result.callback``.
        callback: optional ``callback(t, bel_pred, bel_post, x, y)`` of earlier versions; it
            needs the predicted belief, so predict and update run as two calls.
        keep_mean, keep_var: store the filtered means / marginal variances (T x P numbers).
        monitor: an optional :class:`refbayes.results.InnovationMonitor`.
        gamma, q, obs_var: noise that changes with time, one value per step: gamma (T,),
            q (T,) or (T, P), obs_var (T,), (T, C) or (T, C, C) (Gaussian likelihood); a
            scalar is used at every step. None keeps the filter's own.
        options: extra keywords for the filter's update (e.g. ``rng`` for Monte Carlo filters).

        A step whose model, likelihood or new belief is not finite raises DivergenceError
        naming the step; the caller's belief is untouched.
        """
        from ..results import (PREDICTIVES, InnovationMonitor, ScanResult, StepResult, log_density, log_density_batch,
                               plugin_batch, plugin_from_mean)

        if predictive not in PREDICTIVES:
            raise ValueError(f"predictive must be one of {PREDICTIVES}; got {predictive!r}")
        if callback is not None and on_step is not None:
            raise ValueError("pass callback or on_step, not both")
        for name, fn in (("callback", callback), ("on_step", on_step)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable; got {type(fn).__name__}")
        if monitor is not None and not isinstance(monitor, InnovationMonitor):
            raise TypeError(f"monitor must be a refbayes.results.InnovationMonitor; got {type(monitor).__name__}")
        self._check_belief(bel)
        X, Y = self._check_stream(X, Y)
        T = len(X)
        filters = self._per_step(T, gamma, q, obs_var)
        linearized = predictive == "linearized" or monitor is not None
        split = callback is not None or linearized
        # the plug-in predictive of a static filter is computed for all steps at once, after the loop
        deferred = not linearized and on_step is None and filters is None
        yhats, pmeans, pcovs, lpds, secs, extra = [], [], [], [], np.empty(T), []
        means = np.empty((T, self.n_params)) if keep_mean else None
        variances = np.empty((T, self.n_params)) if keep_var else None
        clock = time.perf_counter
        with Progress(T, type(self).__name__, enabled=progress) as bar:
            for t in range(T):
                start = clock()
                x, y = X[t], Y[t]
                filt = self if filters is None else filters[t]
                try:
                    if split:
                        bel_pred = filt._predict(bel)
                        if linearized:
                            lin_mean, lin_cov = filt.predict_obs(bel_pred, x, method="linearized")
                        bel_new, yhat = filt._step(bel_pred, x, y, **options)
                    else:
                        bel_new, yhat = filt._predict_step(bel, x, y, **options)
                    check_belief_finite(bel_new)
                except DivergenceError as exc:
                    raise exc.at_step(t) from exc.__cause__
                except NotPositiveDefiniteError as exc:
                    named = NotPositiveDefiniteError(f"step {t}: {exc}")
                    named.step = t
                    raise named from exc
                if deferred:
                    pmean = pcov = lpd = None
                elif predictive == "linearized":
                    pmean, pcov = lin_mean, lin_cov
                else:
                    pmean, pcov = plugin_from_mean(filt.likelihood, yhat)
                if not deferred:
                    lpd = log_density(filt.likelihood, y, pmean, pcov)
                secs[t] = clock() - start
                if monitor is not None:
                    monitor.observe(t, self._full_statistic(y, len(lin_mean)) - lin_mean, lin_cov)
                if callback is not None:
                    extra.append(callback(t, bel_pred, bel_new, x, y))
                elif on_step is not None:
                    extra.append(on_step(t, StepResult(t, bel_new, yhat, pmean, pcov, lpd, x, y)))
                if keep_mean:
                    means[t] = bel_new.mean
                if keep_var:
                    variances[t] = bel_new.marginal_variance()
                yhats.append(yhat)
                pmeans.append(pmean)
                pcovs.append(pcov)
                lpds.append(lpd)
                bel = bel_new
                bar.advance()
        C = self.likelihood.obs_dim(self.model.out_dim)
        yhats = np.array(yhats, dtype=np.float64).reshape(T, C)
        if deferred:
            pmeans, pcovs = plugin_batch(self.likelihood, yhats)
            lpds = log_density_batch(self.likelihood, Y, pmeans, pcovs) if T else np.zeros(0)
        lpds = np.array(lpds, dtype=np.float64)
        K = len(pmeans[0]) if T else 0
        result = ScanResult(
            yhat=yhats,
            pred_mean=np.array(pmeans, dtype=np.float64).reshape(T, K),
            pred_cov=np.array(pcovs, dtype=np.float64).reshape(T, K, K),
            log_pred=lpds, log_evidence=np.cumsum(lpds), seconds=secs, predictive=predictive,
            means=means, variances=variances,
            callback=extra if (callback is not None or on_step is not None) else None)
        return bel, result

    def _full_statistic(self, y, K):
        """y as a vector over all K outputs (a one-hot vector for a class label)."""
        if type(self.likelihood).__name__ == "Categorical":
            out = np.zeros(K)
            out[int(y)] = 1.0
            return out
        return np.atleast_1d(np.asarray(y, dtype=np.float64)).reshape(K)

    def predict_obs(self, bel: Belief | ReplayBelief, x: ArrayLike, method: str = "linearized", rng: np.random.Generator | None = None,
                    n_samples: int = 100) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Predictive mean and covariance of the observation at input x.

        method: "plugin" | "linearized" | "mc" | "linearized-mc" | "probit"
        (see refbayes.predictive). For classification the mean is the vector
        of class probabilities (all K classes). "mc" methods need ``rng``.
        """
        self._check_belief(bel)
        return predictive.predict_obs(self.model, self.likelihood, bel, x, method, rng=rng, n_samples=n_samples)

    def _predict(self, bel):
        raise NotImplementedError

    def _update(self, bel, lin):
        raise NotImplementedError

    def _repr_tail(self):
        """", backend=..., dtype=..." where they differ from the defaults (for ``__repr__``)."""
        tail = f", backend={self.backend!r}" if self.backend != "numpy" else ""
        dtype = getattr(self, "dtype", np.dtype(np.float64))
        return tail + (f", dtype={dtype.name}" if dtype != np.float64 else "")

    def __repr__(self):
        return (f"{type(self).__name__}(model={self.model!r}, likelihood={self.likelihood!r}, gamma={self.gamma}, "
                f"q={self.q}{self._repr_tail()})")
