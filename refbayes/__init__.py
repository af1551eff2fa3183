"""refbayes: reference implementations of online Gaussian filters over neural-network parameters.

Readable NumPy code, one function per published update equation, checked
against exact oracles (Kalman filter, conjugate Bayesian linear regression).
"""

from . import exact, linalg, predictive
from .beliefs import DLR, BlockDiag, Diag, FullCov
from .errors import ConvergenceError, DivergenceError, InsufficientMemoryError, NotPositiveDefiniteError
from .filters.bong import Bong
from .filters.diagonal import FDEKF, VDEKF
from .filters.ekf import FullEKF
from .filters.lofi import LoFi, LoFiBelief
from .filters.logistic import LogisticQKF, LogisticRVGA
from .filters.replay import OGD, SGDRB, ReplayBelief
from .filters.rvga import RVGA
from .filters.subspace import SubspaceEKF
from .io import load, save
from .likelihoods import Bernoulli, Categorical, Gaussian, Poisson
from .models import MLP, Function, Linear
from .results import InnovationMonitor, ScanResult, StepResult
from .threads import get_threads, set_threads
from .tune import TuneResult, tune  # the function shadows the submodule's name, before any import of it

__version__ = "0.1.0"

# Submodules imported on first attribute access, so that ``import refbayes``
# stays light: ``refbayes.bandits`` (and whatever it pulls in) loads only when
# ``rb.bandits`` is used.
_LAZY_SUBMODULES = ("bandits", "interchange", "verify", "golden", "parallel", "device")

# Names imported from a submodule on first access: the scikit-learn estimators
# (scikit-learn is imported only when they are used).
_LAZY_NAMES = {
    "BayesianFilterRegressor": "estimator",
    "BayesianFilterClassifier": "estimator",
    "DeviceDLR": "device",
    "DeviceDiag": "device",
}


def __getattr__(name):
    """Import the lazy submodules and names on first access."""
    import importlib

    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    """List the module's globals plus the lazy submodules and names."""
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | set(_LAZY_NAMES))

__all__ = [
    "MLP",
    "Linear",
    "Function",
    "Gaussian",
    "Bernoulli",
    "Categorical",
    "Poisson",
    "FullCov",
    "Diag",
    "BlockDiag",
    "DLR",
    "FullEKF",
    "FDEKF",
    "VDEKF",
    "LoFi",
    "LoFiBelief",
    "SGDRB",
    "OGD",
    "ReplayBelief",
    "Bong",
    "RVGA",
    "LogisticRVGA",
    "LogisticQKF",
    "SubspaceEKF",
    "bandits",
    "interchange",
    "verify",
    "golden",
    "parallel",
    "device",
    "BayesianFilterRegressor",
    "BayesianFilterClassifier",
    "DeviceDLR",
    "DeviceDiag",
    "tune",
    "TuneResult",
    "ScanResult",
    "StepResult",
    "InnovationMonitor",
    "set_threads",
    "get_threads",
    "save",
    "load",
    "exact",
    "linalg",
    "predictive",
    "NotPositiveDefiniteError",
    "ConvergenceError",
    "DivergenceError",
    "InsufficientMemoryError",
]
