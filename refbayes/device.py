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

__all__ = ["DeviceDLR", "DeviceDiag", "to_device", "to_host", "predict_on_device", "step_on_device"]


class _OnDevice:
    """What DeviceDLR and DeviceDiag share: device arrays named in ``_fields`` (host name -> device
    attribute), host copies made on first access and kept read-only, and conversions through the host.
    Placed before the belief class in the bases, so that these methods serve the device belief."""

    _fields: dict = {}
    _host_type: type = object
    _how_to_build = ""

    @classmethod
    def _from_device(cls, *arrays: Any) -> Any:
        """The belief holding the device ``arrays`` (in the order of ``_fields``), which it adopts: once
        it is collected, its arrays may serve a later step (kernels.cuda.step.adopt)."""
        from refbayes.kernels.cuda.step import adopt, belief_dtype

        out = object.__new__(cls)
        object.__setattr__(out, "dtype", belief_dtype(*arrays))
        for attr, arr in zip(cls._fields.values(), arrays):
            object.__setattr__(out, attr, arr)
        object.__setattr__(out, "_host", {})
        object.__setattr__(out, "_kernel_checked", True)  # every producer checks its outputs
        adopt(out, *arrays)
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"build a {type(self).__name__} with {self._how_to_build}")

    def _fetch(self, name: str) -> NDArray[np.float64]:
        cache = self.__dict__["_host"]
        if name not in cache:
            from refbayes.kernels.cuda.step import to_host as copy

            arr = copy(self.__dict__[self._fields[name]])
            if name == "W":  # stored transposed (W^T, row-major) on the device
                arr = np.ascontiguousarray(arr.T)
            arr.setflags(write=False)
            cache[name] = arr
        return cache[name]

    @property
    def n_params(self) -> int:
        """P, the number of parameters (no copy)."""
        return int(self.__dict__["device_mean"].shape[0])

    def to_host(self) -> Any:
        """The same belief with host arrays (a DLR or a Diag)."""
        return self._host_type._trusted(**{name: self._fetch(name).copy() for name in self._fields})

    def replace(self, **changes: Any) -> Any:
        """A host belief with some fields replaced (validated again)."""
        return self.to_host().replace(**changes)

    def astype(self, dtype: Any) -> Any:
        """This belief stored as ``dtype`` (float64 or float32), on the GPU; itself if it already is.
        The conversion goes through the host (one copy of the belief's arrays each way)."""
        from .beliefs import storage_dtype

        if storage_dtype(dtype) == self.dtype:
            return self
        return to_device(self.to_host().astype(dtype))

    def __reduce__(self):
        return (to_device, (self.to_host(),))

    def _repr_sizes(self) -> str:
        return f"P={self.n_params}"

    def __repr__(self):
        dt = "" if self.dtype == np.float64 else f", dtype={self.dtype}"
        return f"{type(self).__name__}({self._repr_sizes()}{dt})"


class DeviceDLR(_OnDevice, DLR):
    """A DLR belief N(mu, (diag(ups) + W W^T)^{-1}) whose arrays are on the GPU.

    Build one with ``to_device(dlr)`` or from ``LoFi(..., backend="cuda")``; not with its
    constructor. Device arrays (numba.cuda), all of ``bel.dtype`` (float64, or float32 for a filter
    built with ``dtype=np.float32``): ``device_mean`` (P,), ``device_ups`` (P,), ``device_Wt`` (L, P).
    ``mean``, ``ups``, ``W`` are host copies made on first access.
    """

    _fields = {"mean": "device_mean", "ups": "device_ups", "W": "device_Wt"}
    _host_type = DLR
    _how_to_build = "refbayes.device.to_device(dlr), or from LoFi(..., backend='cuda')"

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
    def rank(self) -> int:
        """L, the number of columns of W (no copy)."""
        return int(self.__dict__["device_Wt"].shape[0])

    def _repr_sizes(self) -> str:
        return f"P={self.n_params}, rank={self.rank}"


class DeviceDiag(_OnDevice, Diag):
    """A diagonal belief N(mu, diag(var)) whose arrays are on the GPU (``FDEKF`` / ``VDEKF`` with
    ``backend="cuda"``).

    Build one with ``to_device(diag)`` or from the filters; not with its constructor. Device arrays
    (numba.cuda), both of ``bel.dtype``: ``device_mean`` (P,), ``device_var`` (P,). ``mean`` and
    ``var`` are host copies made on first access.
    """

    _fields = {"mean": "device_mean", "var": "device_var"}
    _host_type = Diag
    _how_to_build = "refbayes.device.to_device(diag), or from FDEKF / VDEKF(..., backend='cuda')"

    @property
    def mean(self) -> NDArray[np.float64]:  # type: ignore[override]
        """mu (P,), copied from the GPU on first access."""
        return self._fetch("mean")

    @property
    def var(self) -> NDArray[np.float64]:  # type: ignore[override]
        """var (P,), copied from the GPU on first access."""
        return self._fetch("var")


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


# -- the GPU steps of the filters (LoFi, FDEKF / VDEKF and Bong with backend "cuda") ---------------------------

def predict_on_device(filt: Any, bel: DeviceDLR | DeviceDiag) -> DeviceDLR | DeviceDiag:
    """The predict step (``filt.gamma``, ``filt.q``) of a belief on the GPU, on the GPU: LO-FI's (Chang et al.
    2023, eqs 13-25; kernels.cuda.step.lofi_predict) for a DeviceDLR, mu_bar = gamma mu, v_bar = gamma^2 v + q
    (kernels.cuda.diag_step.diag_predict) for a DeviceDiag."""
    q, dq = filt._device_q()
    if isinstance(bel, DeviceDLR):
        from refbayes.kernels.cuda.step import lofi_predict

        return DeviceDLR._from_device(*lofi_predict(bel.device_mean, bel.device_ups, bel.device_Wt, gamma=filt.gamma,
                                                    q=q, dq=dq))
    from refbayes.kernels.cuda.diag_step import diag_predict

    return DeviceDiag._from_device(*diag_predict(bel.device_mean, bel.device_var, filt.gamma, q=q, dq=dq))


def step_on_device(filt: Any, spec: Any, bel: DLR | Diag, x: Any, y: Any, predict: bool, *, rank: int | None = None,
                   mode: str | None = None, spherical: bool = False
                   ) -> tuple[DeviceDLR | DeviceDiag, NDArray[np.float64]] | None:
    """(new belief on the GPU, yhat (C,)) of one observation on the GPU chain of ``filt`` (its model,
    likelihood, gamma and q; ``spec`` from base.mlp_kernel_spec), ``bel`` moved to the GPU first: the LO-FI
    step to ``rank`` columns (kernels.cuda.step.lofi_mlp_step) for a DLR, the FD-EKF / VD-EKF step of
    ``mode`` (kernels.cuda.diag_step.mlp_diag_step) for a Diag; the predict step first when ``predict``.
    spherical: LO-FI's spherical variant (the discarded directions dropped). None where LO-FI's one-Gram
    route would not be accurate (the caller takes the host route)."""
    x = filt.model.validate_x(x)
    target = filt.likelihood.encode(y, filt.model.out_dim)
    dbel = to_device(bel)
    gamma, (q, dq) = (filt.gamma, filt._device_q()) if predict else (1.0, (0.0, None))
    if isinstance(dbel, DeviceDLR):
        from refbayes.kernels.cuda.step import lofi_mlp_step

        res = lofi_mlp_step(spec, dbel.device_mean, dbel.device_ups, dbel.device_Wt, x, target, rank, gamma=gamma,
                            q=q, dq=dq, spherical=spherical)
        if res is None:
            return None
        return DeviceDLR._from_device(*res[:3]), res[3]
    from refbayes.kernels.cuda.diag_step import mlp_diag_step

    mean, var, yhat = mlp_diag_step(spec, dbel.device_mean, dbel.device_var, x, target, mode, gamma=gamma, q=q, dq=dq)
    return DeviceDiag._from_device(mean, var), yhat
