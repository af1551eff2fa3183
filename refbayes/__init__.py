"""refbayes: reference implementations of online Gaussian filters over neural-network parameters.

Readable NumPy code, one function per published update equation, checked
against exact oracles (Kalman filter, conjugate Bayesian linear regression).
"""

from . import exact, linalg, predictive
from .beliefs import DLR, BlockDiag, Diag, FullCov
from .errors import ConvergenceError, DivergenceError, NotPositiveDefiniteError
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
from .threads import get_threads, set_threads

__version__ = "0.1.0"

# Submodules imported on first attribute access, so that ``import refbayes``
# stays light: ``refbayes.bandits`` (and whatever it pulls in) loads only when
# ``rb.bandits`` is used.
_LAZY_SUBMODULES = ("bandits",)


def __getattr__(name):
    """Import the lazy submodules (``bandits``) on first access."""
    if name in _LAZY_SUBMODULES:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    """List the module's globals plus the lazy submodules."""
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))

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
    "save",
    "load",
    "exact",
    "linalg",
    "predictive",
    "NotPositiveDefiniteError",
    "ConvergenceError",
    "DivergenceError",
]
