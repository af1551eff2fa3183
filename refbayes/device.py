"""Beliefs held on an NVIDIA GPU (``backend="cuda"``; docs/gpu.md).

``DeviceDLR`` is a :class:`refbayes.DLR` whose arrays live in GPU memory: mean (P,), ups (P,) and
W^T (L, P) (row-major, so that the kernels' passes over the parameters are coalesced). ``LoFi`` with
``backend="cuda"`` returns one from ``init``, ``predict_update``, ``update`` and ``scan`` where its
one-chain GPU step applies (an MLP or ``Linear`` model, a Gaussian or categorical likelihood, the
diagonal variant), and a step then moves only x, y and numbers of the network's width across the
bus, never P-sized arrays.

Reading ``bel.mean``, ``bel.ups`` or ``bel.W`` copies that array to the host once (the copy is kept,
read-only); every other DLR method (``covariance``, ``marginal_variance``, ``project``, ``sample``)
works through those copies. ``to_host(bel)`` gives a plain :class:`DLR`; ``to_device(bel)`` moves a
DLR to the GPU. ``refbayes.save`` writes a DeviceDLR as the DLR it holds. Beliefs are immutable on
the device too: no kernel writes into an array of an existing belief.

``DeviceDiag`` is the same for a diagonal belief (mean and var on the GPU): ``FDEKF`` and ``VDEKF``
with ``backend="cuda"`` return one where their one-chain GPU step applies (an MLP or ``Linear``
model, a Gaussian or categorical likelihood, no blocks).

numba.cuda is imported on first use, not with refbayes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .beliefs import DLR, Diag

__all__ = ["DeviceDLR", "DeviceDiag", "to_device", "to_host"]


class DeviceDLR(DLR):
    """A DLR belief N(mu, (diag(ups) + W W^T)^{-1}) whose arrays are on the GPU.

    Build one with ``to_device(dlr)`` or from ``LoFi(..., backend="cuda")``; not with its
    constructor. Device arrays (numba.cuda), all of ``bel.dtype`` (float64, or float32 for a filter
    built with ``dtype=np.float32``): ``device_mean`` (P,), ``device_ups`` (P,), ``device_Wt`` (L, P).
    ``mean``, ``ups``, ``W`` are host copies made on first access.
    """

    @classmethod
    def _from_device(cls, dmean: Any, dups: Any, dWt: Any) -> DeviceDLR:
        from refbayes.kernels.cuda.step import adopt, belief_dtype

        out = object.__new__(cls)
        object.__setattr__(out, "dtype", belief_dtype(dmean, dups, dWt))
        object.__setattr__(out, "device_mean", dmean)
        object.__setattr__(out, "device_ups", dups)
        object.__setattr__(out, "device_Wt", dWt)
        object.__setattr__(out, "_host", {})
        object.__setattr__(out, "_kernel_checked", True)  # every producer checks its outputs
        adopt(out, dmean, dups, dWt)  # once this belief is gone, its arrays may serve a later step
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("build a DeviceDLR with refbayes.device.to_device(dlr), or from LoFi(..., backend='cuda')")

    def _fetch(self, name: str) -> NDArray[np.float64]:
        cache = self.__dict__["_host"]
        if name not in cache:
            from refbayes.kernels.cuda.step import to_host as copy

            if name == "W":
                arr = np.ascontiguousarray(copy(self.__dict__["device_Wt"]).T)
            else:
                arr = copy(self.__dict__[f"device_{name}"])
            arr.setflags(write=False)
            cache[name] = arr
        return cache[name]

    @property
    def mean(self) -> NDArray[np.float64]:  # type: ignore[override]
        """mu (P,), copied from the GPU on first access."""
        return self._fetch("mean")

    @property
    def ups(self) -> NDArray[np.float64]:  # type: ignore[override]
        """ups (P,), copied from the GPU on first access."""
        return self._fetch("ups")

    @property
    def W(self) -> NDArray[np.float64]:  # type: ignore[override]
        """W (P, L), copied from the GPU on first access."""
        return self._fetch("W")

    @property
    def n_params(self) -> int:
        """P, the number of parameters (no copy)."""
        return int(self.__dict__["device_mean"].shape[0])

    @property
    def rank(self) -> int:
        """L, the number of columns of W (no copy)."""
        return int(self.__dict__["device_Wt"].shape[0])

    def to_host(self) -> DLR:
        """The same belief as a plain DLR (host arrays)."""
        return DLR._trusted(mean=self.mean.copy(), ups=self.ups.copy(), W=self.W.copy())

    def astype(self, dtype: Any) -> DeviceDLR:
        """This belief stored as ``dtype`` (float64 or float32), on the GPU; itself if it already is.
        The conversion goes through the host (one copy of 2P + PL numbers each way)."""
        from .beliefs import storage_dtype

        if storage_dtype(dtype) == self.dtype:
            return self
        return to_device(self.to_host().astype(dtype))

    def replace(self, **changes: Any) -> DLR:
        """A host DLR with some fields replaced (validated again)."""
        return self.to_host().replace(**changes)

    def __reduce__(self):
        return (to_device, (self.to_host(),))

    def __repr__(self):
        dt = "" if self.dtype == np.float64 else f", dtype={self.dtype}"
        return f"DeviceDLR(P={self.n_params}, rank={self.rank}{dt})"


class DeviceDiag(Diag):
    """A diagonal belief N(mu, diag(var)) whose arrays are on the GPU (``FDEKF`` / ``VDEKF`` with
    ``backend="cuda"``).

    Build one with ``to_device(diag)`` or from the filters; not with its constructor. Device arrays
    (numba.cuda), both of ``bel.dtype``: ``device_mean`` (P,), ``device_var`` (P,). ``mean`` and
    ``var`` are host copies made on first access.
    """

    @classmethod
    def _from_device(cls, dmean: Any, dvar: Any) -> DeviceDiag:
        from refbayes.kernels.cuda.diag_step import _dtype
        from refbayes.kernels.cuda.step import adopt

        out = object.__new__(cls)
        object.__setattr__(out, "dtype", _dtype(dmean, dvar))
        object.__setattr__(out, "device_mean", dmean)
        object.__setattr__(out, "device_var", dvar)
        object.__setattr__(out, "_host", {})
        object.__setattr__(out, "_kernel_checked", True)  # every producer checks its outputs
        adopt(out, dmean, dvar)  # once this belief is gone, its arrays may serve a later step
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("build a DeviceDiag with refbayes.device.to_device(diag), or from FDEKF / VDEKF(..., "
                        "backend='cuda')")

    def _fetch(self, name: str) -> NDArray[np.float64]:
        cache = self.__dict__["_host"]
        if name not in cache:
            from refbayes.kernels.cuda.step import to_host as copy

            arr = copy(self.__dict__[f"device_{name}"])
            arr.setflags(write=False)
            cache[name] = arr
        return cache[name]

    @property
    def mean(self) -> NDArray[np.float64]:  # type: ignore[override]
        """mu (P,), copied from the GPU on first access."""
        return self._fetch("mean")

    @property
    def var(self) -> NDArray[np.float64]:  # type: ignore[override]
        """var (P,), copied from the GPU on first access."""
        return self._fetch("var")

    @property
    def n_params(self) -> int:
        """P, the number of parameters (no copy)."""
        return int(self.__dict__["device_mean"].shape[0])

    def to_host(self) -> Diag:
        """The same belief as a plain Diag (host arrays)."""
        return Diag._trusted(mean=self.mean.copy(), var=self.var.copy())

    def replace(self, **changes: Any) -> Diag:
        """A host Diag with some fields replaced (validated again)."""
        return self.to_host().replace(**changes)

    def astype(self, dtype: Any) -> DeviceDiag:
        """This belief stored as ``dtype`` (float64 or float32), on the GPU; itself if it already is."""
        from .beliefs import storage_dtype

        if storage_dtype(dtype) == self.dtype:
            return self
        return to_device(self.to_host().astype(dtype))

    def __reduce__(self):
        return (to_device, (self.to_host(),))

    def __repr__(self):
        dt = "" if self.dtype == np.float64 else f", dtype={self.dtype}"
        return f"DeviceDiag(P={self.n_params}{dt})"


def to_device(bel: DLR | Diag) -> DeviceDLR | DeviceDiag:
    """``bel`` (a DLR or a Diag, float64 or float32) on the GPU: a DeviceDLR or DeviceDiag of the same dtype
    (returned as is if it already is one). Copies 2P + PL numbers (a Diag: 2P)."""
    if isinstance(bel, (DeviceDLR, DeviceDiag)):
        return bel
    if type(bel) not in (DLR, Diag):
        raise TypeError(f"to_device takes a refbayes.DLR or a refbayes.Diag; got {type(bel).__name__}")
    from .filters.base import _require_cuda

    _require_cuda()  # a clear error where there is no GPU (nor the simulator)
    from refbayes.kernels.cuda.step import to_device as copy

    if type(bel) is Diag:
        return DeviceDiag._from_device(copy(bel.mean), copy(bel.var))
    return DeviceDLR._from_device(copy(bel.mean), copy(bel.ups), copy(np.ascontiguousarray(bel.W.T)))


def to_host(bel: Any) -> Any:
    """``bel`` with host arrays: a DeviceDLR's DLR, a DeviceDiag's Diag; any other belief as it is."""
    return bel.to_host() if isinstance(bel, (DeviceDLR, DeviceDiag)) else bel
