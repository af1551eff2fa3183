"""Immutable Gaussian beliefs over a flat parameter vector theta (P,).

Each belief stores read-only arrays of one floating dtype, ``bel.dtype``:
float64 (the default) or float32 (``dtype=np.float32``: half the memory; the
filters with a float32 path are listed in docs/conventions.md). Filters return
new beliefs of their input's dtype and never write into old ones. Dense ``covariance()`` / ``precision()`` are for
tests and small P; ``project`` and ``sample`` work at any P.

- FullCov: N(mean, cov), cov (P, P).
- Diag: N(mean, diag(var)), var (P,).
- BlockDiag: N(mean, blockdiag(covs)) over a partition of the indices.
- DLR: N(mean, (diag(ups) + W W^T)^{-1}), ups (P,), W (P, L); the precision is
  diagonal plus low rank (LO-FI, BONG's DLR family).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import linalg
from ._validate import as_float_array

__all__ = ["Belief", "FullCov", "Diag", "BlockDiag", "DLR", "DTYPES"]

DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
"""The dtypes a belief's arrays may have."""


def storage_dtype(dtype, what="dtype"):
    """``dtype`` as one of DTYPES (np.float64 / "float64" / np.float32 / "float32"), else a clear error."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in DTYPES:
        raise ValueError(f"{what} must be float64 or float32; got {dtype!r}")
    return dt


def _frozen(arr, dtype=np.float64):
    arr = np.array(arr, dtype=dtype, copy=True)
    arr.setflags(write=False)
    return arr


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")


@dataclass(frozen=True, eq=False)
class Belief:
    """Base class: a Gaussian belief with a ``mean`` of shape (P,).

    dtype (keyword-only): float64 (default) or float32, the dtype every array of the
    belief is stored in; inputs of other dtypes are converted (a value beyond float32's
    range is an error, not an inf).
    """

    mean: np.ndarray
    dtype: np.dtype = dataclasses.field(default=DTYPES[0], kw_only=True)

    def _freeze(self, name, value, shape):
        arr = as_float_array(value, f"{type(self).__name__}.{name}", shape=shape, dtype=self.dtype)
        object.__setattr__(self, name, _frozen(arr, self.dtype))

    def __post_init__(self):
        object.__setattr__(self, "dtype", storage_dtype(self.dtype, f"{type(self).__name__}.dtype"))
        self._freeze("mean", self.mean, (None,))

    @classmethod
    def _trusted(cls, **arrays):
        """A belief from arrays that the caller has already checked and owns; its dtype is the
        mean's (float64 or float32), and the other arrays must have it.

        For compiled backends whose kernels check their outputs (finite, positive
        variances) and return fresh arrays: the arrays are made read-only and used
        as they are, skipping a second validation pass and copy.
        """
        out = object.__new__(cls)
        dtype = arrays["mean"].dtype
        if dtype not in DTYPES or any(arr.dtype != dtype for arr in arrays.values()):
            raise TypeError(f"a trusted {cls.__name__} needs arrays of one dtype in {DTYPES}; got "
                            f"{ {name: str(arr.dtype) for name, arr in arrays.items()} }")
        object.__setattr__(out, "dtype", dtype)
        for name, arr in arrays.items():
            arr.setflags(write=False)
            object.__setattr__(out, name, arr)
        object.__setattr__(out, "_kernel_checked", True)  # finite: filters need not scan it again
        return out

    @property
    def n_params(self) -> int:
        """P, the number of parameters."""
        return self.mean.shape[0]

    def replace(self, **changes: Any) -> Belief:
        """A new belief with some fields replaced (validated again), in this belief's dtype
        unless ``dtype`` is among the changes."""
        return dataclasses.replace(self, **changes)

    def astype(self, dtype: Any) -> Belief:
        """This belief with its arrays stored as ``dtype`` (float64 or float32); itself if it already is.

        float64 -> float32 rounds every number to float32 (relative error <= 2^-24); a value
        beyond float32's range raises ValueError.
        """
        dtype = storage_dtype(dtype)
        return self if dtype == self.dtype else self.replace(dtype=dtype)

    def covariance(self) -> NDArray[np.float64]:
        """Dense (P, P) covariance."""
        raise NotImplementedError

    def precision(self) -> NDArray[np.float64]:
        """Dense (P, P) precision."""
        raise NotImplementedError

    def marginal_variance(self) -> NDArray[np.float64]:
        """(P,) diagonal of the covariance."""
        return np.diag(self.covariance()).copy()

    def project(self, J: ArrayLike) -> NDArray[np.float64]:
        """J Sigma J^T for J (C, P); returns (C, C)."""
        J = as_float_array(J, "J", shape=(None, self.n_params))
        return linalg.symmetrize(J @ self.covariance() @ J.T)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> NDArray[np.float64]:
        """Draw from the belief: (P,) if n is None, else (n, P)."""
        _check_rng(rng)
        m = 1 if n is None else int(n)
        if m < 0:
            raise ValueError(f"n must be >= 0; got {n}")
        draws = self._sample(rng, m)
        return draws[0] if n is None else draws

    def _sample(self, rng, n):
        L = linalg.cholesky(self.covariance(), "covariance")
        return self.mean + rng.standard_normal((n, self.n_params)) @ L.T

    def __repr__(self):
        return f"{type(self).__name__}(P={self.n_params})"


@dataclass(frozen=True, eq=False)
class FullCov(Belief):
    """Full-covariance Gaussian N(mean, cov)."""

    cov: np.ndarray

    def __post_init__(self):
        super().__post_init__()
        P = self.n_params
        self._freeze("cov", self.cov, (P, P))
        asym = np.abs(self.cov - self.cov.T).max(initial=0.0)
        if asym > 1e-10 * np.abs(self.cov).max(initial=0.0):
            raise ValueError(f"FullCov.cov must be symmetric; got max |cov - cov^T| = {asym:.3g}")

    @classmethod
    def _from_filter(cls, mean, cov):
        """A FullCov from arrays a filter step has just built and owns (internal).

        mean (P,) and cov (P, P) must be fresh float64 arrays that nothing else
        references; they are made read-only and used without the O(P^2) copy and
        symmetry scan that user-constructed beliefs get (the filter builds cov
        symmetric by construction). The finiteness check of the filter base still
        reads the mean and the diagonal.
        """
        mean = np.asarray(mean, dtype=np.float64)
        cov = np.asarray(cov, dtype=np.float64)
        P = mean.shape[0]
        if mean.ndim != 1 or cov.shape != (P, P):
            raise ValueError(f"FullCov._from_filter needs mean (P,) and cov (P, P); got {mean.shape} and {cov.shape}")
        out = object.__new__(cls)
        object.__setattr__(out, "dtype", DTYPES[0])
        mean.setflags(write=False)
        cov.setflags(write=False)
        object.__setattr__(out, "mean", mean)
        object.__setattr__(out, "cov", cov)
        return out

    def covariance(self) -> NDArray[np.float64]:
        return self.cov.copy()

    def precision(self) -> NDArray[np.float64]:
        return linalg.symmetrize(linalg.psd_solve(self.cov, np.eye(self.n_params), name="covariance"))

    def marginal_variance(self) -> NDArray[np.float64]:
        return np.diag(self.cov).copy()


@dataclass(frozen=True, eq=False)
class Diag(Belief):
    """Diagonal Gaussian N(mean, diag(var)); var > 0."""

    var: np.ndarray

    def __post_init__(self):
        super().__post_init__()
        self._freeze("var", self.var, (self.n_params,))
        if np.any(self.var <= 0):
            raise ValueError(f"Diag.var must be > 0; got minimum {self.var.min()}")

    def covariance(self) -> NDArray[np.float64]:
        return np.diag(self.var)

    def precision(self) -> NDArray[np.float64]:
        return np.diag(1.0 / self.var)

    def marginal_variance(self) -> NDArray[np.float64]:
        return self.var.copy()

    def project(self, J: ArrayLike) -> NDArray[np.float64]:
        J = as_float_array(J, "J", shape=(None, self.n_params))
        return linalg.symmetrize((J * self.var) @ J.T)

    def _sample(self, rng, n):
        return self.mean + rng.standard_normal((n, self.n_params)) * np.sqrt(self.var)


@dataclass(frozen=True, eq=False)
class BlockDiag(Belief):
    """Block-diagonal Gaussian: blocks ``covs[g]`` over the index sets ``groups[g]``.

    groups: tuple of integer index arrays partitioning range(P); covs[g] has
    shape (len(groups[g]), len(groups[g])).
    """

    groups: tuple
    covs: tuple

    def __post_init__(self):
        super().__post_init__()
        P = self.n_params
        groups = tuple(np.array(g, dtype=np.intp, copy=True).reshape(-1) for g in self.groups)
        if len(groups) != len(self.covs):
            raise ValueError(f"BlockDiag needs one cov per group; got {len(groups)} groups and {len(self.covs)} covs")
        allidx = np.concatenate(groups) if groups else np.zeros(0, np.intp)
        if allidx.shape[0] != P or not np.array_equal(np.sort(allidx), np.arange(P)):
            raise ValueError(f"BlockDiag.groups must partition range({P})")
        covs = []
        for i, (g, c) in enumerate(zip(groups, self.covs)):
            c = as_float_array(c, f"BlockDiag.covs[{i}]", shape=(len(g), len(g)), dtype=self.dtype)
            covs.append(_frozen(c, self.dtype))
            g.setflags(write=False)
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "covs", tuple(covs))

    def covariance(self) -> NDArray[np.float64]:
        out = np.zeros((self.n_params, self.n_params))
        for g, c in zip(self.groups, self.covs):
            out[np.ix_(g, g)] = c
        return out

    def precision(self) -> NDArray[np.float64]:
        out = np.zeros((self.n_params, self.n_params))
        for g, c in zip(self.groups, self.covs):
            out[np.ix_(g, g)] = linalg.psd_solve(c, np.eye(len(g)), name="covariance block")
        return out

    def marginal_variance(self) -> NDArray[np.float64]:
        out = np.empty(self.n_params)
        for g, c in zip(self.groups, self.covs):
            out[g] = np.diag(c)
        return out

    def project(self, J: ArrayLike) -> NDArray[np.float64]:
        J = as_float_array(J, "J", shape=(None, self.n_params))
        out = np.zeros((J.shape[0], J.shape[0]))
        for g, c in zip(self.groups, self.covs):
            Jg = J[:, g]
            out += Jg @ c @ Jg.T
        return linalg.symmetrize(out)

    def _sample(self, rng, n):
        out = np.empty((n, self.n_params))
        for g, c in zip(self.groups, self.covs):
            L = linalg.cholesky(c, "covariance block")
            out[:, g] = self.mean[g] + rng.standard_normal((n, len(g))) @ L.T
        return out


@dataclass(frozen=True, eq=False)
class DLR(Belief):
    """Gaussian with diagonal-plus-low-rank precision diag(ups) + W W^T.

    ups: (P,) positive diagonal precision; W: (P, L) low-rank factor (L may be 0). W is defined
    up to a right orthogonal factor (compare W W^T across implementations, not W); ``sample``
    gives the same draws for W and for W with any columns negated (``linalg.dlr_sample``).
    """

    ups: np.ndarray
    W: np.ndarray

    def __post_init__(self):
        super().__post_init__()
        P = self.n_params
        self._freeze("ups", self.ups, (P,))
        self._freeze("W", self.W, (P, None))
        if np.any(self.ups <= 0):
            raise ValueError(f"DLR.ups must be > 0; got minimum {self.ups.min()}")

    @property
    def rank(self) -> int:
        """L, the number of columns of W."""
        return self.W.shape[1]

    def covariance(self) -> NDArray[np.float64]:
        return linalg.dlr_covariance(self.ups, self.W)

    def precision(self) -> NDArray[np.float64]:
        return linalg.dlr_precision(self.ups, self.W)

    def marginal_variance(self) -> NDArray[np.float64]:
        # diag of D - D W K W^T D with D = diag(1/ups), K = (I + W^T D W)^{-1}; O(P L^2).
        Dinv = 1.0 / self.ups
        if self.rank == 0:
            return Dinv.copy()
        DW = self.W * Dinv[:, None]
        Lk = linalg.cholesky(linalg.dlr_inner(self.ups, self.W), "I + W^T diag(1/ups) W")
        B = np.linalg.solve(Lk, DW.T)  # (L, P)
        return Dinv - np.einsum("ij,ij->j", B, B)

    def project(self, J: ArrayLike) -> NDArray[np.float64]:
        J = as_float_array(J, "J", shape=(None, self.n_params))
        return linalg.dlr_quadratic(self.ups, self.W, J)

    def _sample(self, rng, n):
        return linalg.dlr_sample(self.mean, self.ups, self.W, rng, n)
