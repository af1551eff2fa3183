"""scikit-learn style estimators over any refbayes filter (CPU deployments, pipelines, cross-validation).

``BayesianFilterRegressor`` and ``BayesianFilterClassifier`` wrap a network (``rb.MLP`` by default,
or any refbayes model from a factory) and a recursive Gaussian filter (LO-FI, FD-EKF, VD-EKF,
full EKF, BONG) behind ``fit`` / ``partial_fit`` / ``predict`` / ``score``:

- ``fit(X, y)`` starts from the prior N(theta_0, prior_var I) (theta_0 from the model's
  ``init_params`` with a Generator seeded by ``random_state``) and runs ``n_epochs`` passes of
  ``filter.predict_update(bel, x_n, y_n)``, one observation at a time (shuffled each pass when
  ``shuffle``). One pass is exact sequential Bayesian updating of the linearised model; further
  passes reuse the data and so over-count it (a tempered posterior), as the papers' multi-pass
  experiments do.
- ``partial_fit(X, y)`` continues from the current belief with one pass over the rows in the
  given order (the first call initialises; the classifier needs ``classes=`` then).
- ``predict`` uses the posterior mean's network output (the plug-in predictive); the regressor's
  ``return_std=True`` adds the linearised predictive standard deviation sqrt(H Sigma H^T + R)
  (diagonal EKF paper's predictive; LO-FI paper eq. 63); the classifier's ``predict_proba`` uses
  ``predictive`` ("plugin", "linearized", "probit" (LO-FI paper eqs 64-66) or "mc").

Input scaling is the caller's job: the prior N(0, prior_var I) and the LeCun initialisation
assume inputs of order one, so put a ``StandardScaler`` in front (``make_pipeline``). The
regressor standardises y by default (``normalize_y=True``; the mean and standard deviation of
the first fit or partial_fit batch), so ``obs_var`` is in units of y's variance.

The estimators only call the filters' public step-by-step API, so they work with every
backend: ``backend="numba"`` runs the compiled kernels where the filter has them.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.utils.multiclass import _check_partial_fit_first_call, check_classification_targets
    from sklearn.utils.validation import check_is_fitted
    from threadpoolctl import threadpool_limits
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("refbayes.estimator needs scikit-learn (pip install scikit-learn); "
                      f"importing it failed: {exc}") from exc

try:
    from sklearn.utils.validation import validate_data
except ImportError:  # pragma: no cover - scikit-learn < 1.6
    def validate_data(estimator, X="no_validation", y="no_validation", reset=True, **kwargs):
        return estimator._validate_data(X, y, reset=reset, **kwargs)

from .filters.bong import Bong
from .filters.diagonal import FDEKF, VDEKF
from .filters.ekf import FullEKF
from .filters.lofi import LoFi
from .likelihoods import Categorical, Gaussian
from .models import MLP

if TYPE_CHECKING:
    from .models import Model

__all__ = ["BayesianFilterRegressor", "BayesianFilterClassifier", "FILTERS"]

#: Filter names accepted by the estimators' ``filter`` argument.
FILTERS = {
    "lofi": LoFi,
    "fd-ekf": FDEKF,
    "vd-ekf": VDEKF,
    "full-ekf": FullEKF,
    "bong": Bong,
}


def _generator(random_state):
    """A numpy Generator from sklearn's random_state conventions (None, int, RandomState, Generator)."""
    if random_state is None or isinstance(random_state, (numbers.Integral, np.integer)):
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    raise ValueError(f"random_state must be None, an int, a RandomState or a Generator; got {random_state!r}")


def _positive_int(value):
    return (isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
            and value >= 1)


class _FilterEstimator(BaseEstimator):
    """Shared machinery: model and filter construction, the passes over the data, the belief."""

    def _check_params(self):
        if self.model is not None and not callable(self.model):
            raise TypeError("model must be None or a callable model(n_features, n_outputs); "
                            f"got {type(self.model).__name__}")
        if self.model is None:
            try:
                sizes = tuple(self.hidden_layer_sizes)
            except TypeError:
                raise TypeError("hidden_layer_sizes must be a sequence of positive integers; "
                                f"got {self.hidden_layer_sizes!r}") from None
            if not all(_positive_int(s) for s in sizes):
                raise ValueError(f"hidden_layer_sizes must hold positive integers; got {self.hidden_layer_sizes!r}")
        if isinstance(self.filter, str):
            if self.filter not in FILTERS:
                raise ValueError(f"filter must be one of {sorted(FILTERS)} or a filter class; got {self.filter!r}")
        elif not callable(self.filter):
            raise TypeError(f"filter must be a name in {sorted(FILTERS)} or a callable filter(model, likelihood, "
                            f"**kwargs); got {type(self.filter).__name__}")
        if self.filter_kwargs is not None and not isinstance(self.filter_kwargs, dict):
            raise TypeError(f"filter_kwargs must be a dict or None; got {type(self.filter_kwargs).__name__}")
        if not _positive_int(self.n_epochs):
            raise ValueError(f"n_epochs must be a positive integer; got {self.n_epochs!r}")
        if self.blas_threads is not None and not _positive_int(self.blas_threads):
            raise ValueError(f"blas_threads must be None or a positive integer; got {self.blas_threads!r}")

    def _make_model(self, n_features, n_outputs):
        if self.model is not None:
            model = self.model(n_features, n_outputs)
            in_dim, out_dim = getattr(model, "in_dim", None), getattr(model, "out_dim", None)
            if in_dim != n_features or out_dim != n_outputs:
                raise ValueError(f"model(n_features={n_features}, n_outputs={n_outputs}) must return a refbayes "
                                 f"model with in_dim={n_features} and out_dim={n_outputs}; got in_dim={in_dim}, "
                                 f"out_dim={out_dim}")
            return model
        return MLP([n_features, *self.hidden_layer_sizes, n_outputs], activation=self.activation)

    def _make_filter(self, model, likelihood):
        cls = FILTERS[self.filter] if isinstance(self.filter, str) else self.filter
        kwargs = dict(self.filter_kwargs or {})
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}
        if "backend" in params and "backend" not in kwargs:
            kwargs["backend"] = self.backend
        return cls(model, likelihood, **kwargs)

    def _filter(self):
        return self._make_filter(self.model_, self._likelihood())

    def _init_state(self, n_features, n_outputs):
        """Model and Generator for a fresh fit; nothing is stored yet."""
        rng = _generator(self.random_state)
        model = self._make_model(n_features, n_outputs)
        return model, rng

    def _blas(self):
        """A context that limits BLAS to ``blas_threads`` threads (none when it is None)."""
        if self.blas_threads is None:
            return contextlib.nullcontext()
        return threadpool_limits(limits=int(self.blas_threads), user_api="blas")

    def _run(self, filt, bel, X, T, order_rng, n_epochs, shuffle):
        """n_epochs passes of predict_update over the rows of X with targets T; returns the belief."""
        n = X.shape[0]
        draws = {"rng": self._rng} if getattr(filt, "needs_rng", False) else {}  # randomness passed per call
        with self._blas():
            for _ in range(n_epochs):
                order = order_rng.permutation(n) if shuffle else range(n)
                for i in order:
                    bel = filt.predict_update(bel, X[i], T[i], **draws)
        return bel

    @contextlib.contextmanager
    def _atomic(self):
        """Restore every attribute if the body raises (a diverging fit leaves the last fit intact)."""
        saved = dict(self.__dict__)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _fit_fresh(self, X, T, n_outputs, n_epochs, shuffle):
        model, rng = self._init_state(X.shape[1], n_outputs)
        self._rng = rng
        self._predict_seed = int(rng.integers(2**31 - 1))  # the Monte Carlo predictive's draws
        self.model_ = model
        filt = self._filter()
        bel = filt.init(model.init_params(rng), prior_var=self.prior_var)
        bel = self._run(filt, bel, X, T, rng, n_epochs, shuffle)
        self.belief_ = bel
        self.n_updates_ = n_epochs * X.shape[0]
        return self

    def _continue(self, X, T):
        filt = self._filter()
        self.belief_ = self._run(filt, self.belief_, X, T, self._rng, 1, False)
        self.n_updates_ += X.shape[0]
        return self

    def _predict_obs(self, X, method):
        """Predictive (mean (N, K), cov (N, K, K)) for the rows of X."""
        filt = self._filter()
        rng = np.random.default_rng(self._predict_seed) if method in ("mc", "linearized-mc") else None
        with self._blas():
            return filt.predict_obs(self.belief_, X, method=method, rng=rng)


class BayesianFilterRegressor(RegressorMixin, _FilterEstimator):
    """Regression with a Gaussian likelihood, learnt online by a refbayes filter.

    Parameters
    ----------
    hidden_layer_sizes : tuple of int, default (8,)
        Hidden layers of the ``rb.MLP`` [n_features, *hidden_layer_sizes, n_outputs] (empty: linear).
    activation : str, default "tanh"
        Hidden-layer activation (``rb.models.ACTIVATIONS``).
    model : callable or None
        ``model(n_features, n_outputs)`` returning a refbayes model; replaces the MLP.
    filter : str or class, default "lofi"
        "lofi", "fd-ekf", "vd-ekf", "full-ekf", "bong", or a filter class called as
        ``filter(model, likelihood, **filter_kwargs)``.
    filter_kwargs : dict or None
        Keyword arguments of the filter (rank, gamma, q, family, ...). ``backend`` is filled in
        from this estimator where the filter takes it and it is not given; a filter that draws
        random numbers (``needs_rng``) gets this estimator's generator with each step.
    obs_var : float, default 0.1
        Gaussian observation noise variance R (of the standardised y when normalize_y).
    prior_var : float, default 1.0
        Prior variance of every parameter.
    n_epochs : int, default 1
        Passes over the data in ``fit``.
    shuffle : bool, default True
        Shuffle the rows before each pass in ``fit``.
    normalize_y : bool, default True
        Standardise y (per output) with the first batch's mean and standard deviation.
    random_state : None, int, RandomState or Generator
        Seeds the initial mean, the shuffling and the filter's own draws.
    backend : "numpy" | "numba" | "cuda", default "numpy"
    blas_threads : int or None, default 1
        BLAS threads during fit and predict (the per-observation matrices are small, and a
        multi-threaded BLAS spends more time waking its threads than computing: a LO-FI fit to 600
        digits took 9 s with 2 OpenBLAS threads and 1 s with one). None leaves BLAS as it is.

    Attributes
    ----------
    model_, belief_ : the refbayes model and the filter's current belief over its parameters.
    n_features_in_, n_outputs_, y_mean_, y_std_, n_updates_ (observations processed).
    """

    def __init__(self, hidden_layer_sizes: Sequence[int] = (8,), activation: str = "tanh",
                 model: Callable[[int, int], Model] | None = None, filter: str | type = "lofi",
                 filter_kwargs: Mapping[str, Any] | None = None, obs_var: float = 0.1, prior_var: float = 1.0,
                 n_epochs: int = 1, shuffle: bool = True, normalize_y: bool = True,
                 random_state: int | np.random.RandomState | np.random.Generator | None = None,
                 backend: str = "numpy", blas_threads: int | None = 1) -> None:
        # same shape as BayesianFilterClassifier.__init__: deliberate, scikit-learn's contract is that
        # each estimator's __init__ stores every parameter it lists, unchanged, under its own name
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.model = model
        self.filter = filter
        self.filter_kwargs = filter_kwargs
        self.obs_var = obs_var
        self.prior_var = prior_var
        self.n_epochs = n_epochs
        self.shuffle = shuffle
        self.normalize_y = normalize_y
        self.random_state = random_state
        self.backend = backend
        self.blas_threads = blas_threads

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags

    def _more_tags(self):  # scikit-learn < 1.6
        return {"multioutput": True}

    def _likelihood(self):
        return Gaussian(self.obs_var)

    def _targets(self, y):
        Y = y.reshape(len(y), -1).astype(np.float64)
        return (Y - self.y_mean_) / self.y_std_

    def _set_y_stats(self, y):
        Y = y.reshape(len(y), -1).astype(np.float64)
        if self.normalize_y:
            mean = Y.mean(axis=0)
            std = Y.std(axis=0) if len(Y) > 1 else np.ones(Y.shape[1])
            std = np.where(std > 0, std, 1.0)
        else:
            mean, std = np.zeros(Y.shape[1]), np.ones(Y.shape[1])
        self.y_mean_, self.y_std_ = mean, std
        self.n_outputs_ = Y.shape[1]
        self._y_2d = y.ndim == 2

    def fit(self, X: ArrayLike, y: ArrayLike) -> BayesianFilterRegressor:
        """Fit from the prior: ``n_epochs`` passes of predict_update. X (N, D), y (N,) or (N, C). Returns self.

        An error (bad input, a filter that diverges) leaves the estimator as it was."""
        with self._atomic():
            return self._fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike) -> BayesianFilterRegressor:
        """One pass over (X, y) in order, continuing from the current belief (the first call starts
        from the prior). An error leaves the estimator as it was."""
        with self._atomic():
            return self._partial_fit(X, y)

    def _fit(self, X, y):
        X, y = validate_data(self, X, y, dtype=np.float64, multi_output=True, y_numeric=True)
        self._check_params()
        self._set_y_stats(y)
        return self._fit_fresh(X, self._targets(y), self.n_outputs_, self.n_epochs, self.shuffle)

    def _partial_fit(self, X, y):
        first = not hasattr(self, "belief_")
        X, y = validate_data(self, X, y, dtype=np.float64, multi_output=True, y_numeric=True, reset=first)
        if first:
            self._check_params()
            self._set_y_stats(y)
            return self._fit_fresh(X, self._targets(y), self.n_outputs_, 1, False)
        n_out = 1 if y.ndim == 1 else y.shape[1]
        if n_out != self.n_outputs_:
            raise ValueError(f"y must have {self.n_outputs_} output(s) as in the first call; got {n_out}")
        return self._continue(X, self._targets(y))

    def predict(self, X: ArrayLike, return_std: bool = False) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Posterior-mean prediction (N,) or (N, C); with ``return_std`` also the linearised
        predictive standard deviation of y (noise included), the same shape."""
        check_is_fitted(self, "belief_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        mean, cov = self._predict_obs(X, "linearized" if return_std else "plugin")
        mean = mean.reshape(X.shape[0], self.n_outputs_) * self.y_std_ + self.y_mean_
        if not self._y_2d:
            mean = mean[:, 0]
        if not return_std:
            return mean
        std = np.sqrt(np.diagonal(cov.reshape(X.shape[0], self.n_outputs_, self.n_outputs_), axis1=1, axis2=2))
        std = std * self.y_std_
        return mean, (std if self._y_2d else std[:, 0])


class BayesianFilterClassifier(ClassifierMixin, _FilterEstimator):
    """Classification with a categorical (softmax) likelihood, learnt online by a refbayes filter.

    Parameters as :class:`BayesianFilterRegressor` (without obs_var and normalize_y), plus

    predictive : "plugin" | "linearized" | "probit" | "mc", default "plugin"
        How ``predict_proba`` averages over the belief: softmax at the posterior mean
        ("plugin" and "linearized" give the same probabilities), the generalised probit
        (LO-FI paper eqs 64-66), or Monte Carlo over 100 parameter draws.

    The network has one output per class (K outputs, softmax). Attributes: ``classes_``,
    ``model_``, ``belief_``, ``n_features_in_``, ``n_updates_``.
    """

    _PREDICTIVES = ("plugin", "linearized", "probit", "mc")

    def __init__(self, hidden_layer_sizes: Sequence[int] = (8,), activation: str = "tanh",
                 model: Callable[[int, int], Model] | None = None, filter: str | type = "lofi",
                 filter_kwargs: Mapping[str, Any] | None = None, prior_var: float = 1.0, n_epochs: int = 1,
                 shuffle: bool = True, predictive: str = "plugin",
                 random_state: int | np.random.RandomState | np.random.Generator | None = None,
                 backend: str = "numpy", blas_threads: int | None = 1) -> None:
        # same shape as BayesianFilterRegressor.__init__: deliberate (scikit-learn's __init__ contract)
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.model = model
        self.filter = filter
        self.filter_kwargs = filter_kwargs
        self.prior_var = prior_var
        self.n_epochs = n_epochs
        self.shuffle = shuffle
        self.predictive = predictive
        self.random_state = random_state
        self.backend = backend
        self.blas_threads = blas_threads

    def _likelihood(self):
        return Categorical(len(self.classes_))

    def _check_params(self):
        super()._check_params()
        if self.predictive not in self._PREDICTIVES:
            raise ValueError(f"predictive must be one of {self._PREDICTIVES}; got {self.predictive!r}")

    def _encode(self, y):
        idx = np.searchsorted(self.classes_, y)
        idx = np.clip(idx, 0, len(self.classes_) - 1)
        bad = self.classes_[idx] != y
        if np.any(bad):
            unknown = sorted(set(np.asarray(y)[bad].tolist()))
            raise ValueError(f"y contains labels not in classes_ {list(self.classes_)}: {unknown}")
        return idx

    @staticmethod
    def _check_two_classes(classes):
        if len(classes) < 2:
            raise ValueError(f"BayesianFilterClassifier needs at least 2 classes; the data contains only one class "
                             f"({np.asarray(classes[0]).item()!r})")

    def fit(self, X: ArrayLike, y: ArrayLike) -> BayesianFilterClassifier:
        """Fit from the prior: ``n_epochs`` passes of predict_update. X (N, D), y (N,) labels. Returns self.

        An error (bad input, a filter that diverges) leaves the estimator as it was."""
        with self._atomic():
            return self._fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike, classes: ArrayLike | None = None) -> BayesianFilterClassifier:
        """One pass over (X, y) in order, continuing from the current belief.

        classes: all labels, required on the first call (as for sklearn's SGDClassifier).
        An error leaves the estimator as it was."""
        with self._atomic():
            return self._partial_fit(X, y, classes)

    def _fit(self, X, y):
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self._check_params()
        classes = np.unique(y)
        self._check_two_classes(classes)
        self.classes_ = classes
        return self._fit_fresh(X, self._encode(y), len(classes), self.n_epochs, self.shuffle)

    def _partial_fit(self, X, y, classes):
        first = not hasattr(self, "belief_")
        X, y = validate_data(self, X, y, dtype=np.float64, reset=first)
        check_classification_targets(y)
        if first:
            self._check_params()
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            self._check_two_classes(np.unique(classes))
        _check_partial_fit_first_call(self, classes)
        T = self._encode(y)
        if first:
            return self._fit_fresh(X, T, len(self.classes_), 1, False)
        return self._continue(X, T)

    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities (N, K), columns in the order of ``classes_``."""
        check_is_fitted(self, "belief_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        self._check_params()
        mean, _ = self._predict_obs(X, self.predictive)
        P = np.clip(mean.reshape(X.shape[0], len(self.classes_)), 0.0, None)
        return P / P.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        """log of ``predict_proba`` (N, K)."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        """The most probable class of each row (N,)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
