"""Diagonal and block-diagonal approximations of the EKF: FD-EKF and VD-EKF.

Chang, Jones & Murphy (2022), "On diagonal approximations to the extended
Kalman filter for online training of Bayesian neural networks".

- FD-EKF (fully decoupled; eqs 10-12): keeps the diagonal of the EKF
  posterior covariance, i.e. minimises KL(p || q) over diagonal q.
- VD-EKF (variational diagonal; eqs 13-14, 25): keeps the diagonal of the EKF
  posterior precision, i.e. minimises KL(q || p) over diagonal q.

The diagonal functions cost O(P C^2 + C^3) and never build a P x P matrix.
Block variants replace each diagonal entry by a dense block over a group of
parameters (the decoupled EKF of Puskorius & Feldkamp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .. import linalg
from ..beliefs import BlockDiag, Diag
from ..errors import NotPositiveDefiniteError
from ..likelihoods import whiten
from .base import Filter, mlp_kernel_spec, require_finite

if TYPE_CHECKING:
    from ..likelihoods import Likelihood
    from ..models import Model

__all__ = [
    "predict",
    "fd_update",
    "vd_update",
    "block_predict",
    "fd_block_update",
    "vd_block_update",
    "FDEKF",
    "VDEKF",
    "VD_MEAN_RULES",
]

VD_MEAN_RULES = ("paper", "ekf")


def predict(bel, gamma, q):
    """Predict step (eq. 3 with diagonal Q): mu <- gamma mu, v <- gamma^2 v + q.

    bel: Diag (P); gamma scalar; q scalar or (P,). Returns Diag.
    """
    return Diag(gamma * bel.mean, gamma**2 * bel.var + q, dtype=bel.dtype)


def _is_device(bel):
    """Whether ``bel`` is a belief on the GPU (refbayes.device.DeviceDiag), without importing numba.cuda."""
    return getattr(bel, "device_var", None) is not None


def _positive(var, what):
    """var when every entry is finite and > 0; DivergenceError for a non-finite entry (overflow),
    NotPositiveDefiniteError for one <= 0 (round-off)."""
    require_finite(f"{what} variance update", var)
    if not np.all(var > 0):
        i = int(np.argmin(var))
        raise NotPositiveDefiniteError(f"{what} variance {i} became {float(var[i])!r} (round-off); use a larger prior "
                                       "or observation noise")
    return var


def fd_gain_terms(var, H, R, singular=False):
    """S^{-1} H (C, P) with S = R + H diag(var) H^T (eq. 10's innovation covariance)."""
    S = linalg.symmetrize(R + (H * var) @ H.T)
    return linalg.psd_solve(S, H, pinv=singular, name="innovation covariance S")


def fd_update(bel, H, R, e, singular=False):
    """FD-EKF update (Chang et al. 2022, eqs 10-12).

    S = R + H diag(v) H^T, K = diag(v) H^T S^{-1}, mu' = mu + K e,
    v'_i = v_i - v_i^2 h_i^T S^{-1} h_i (h_i = column i of H).
    bel: Diag (P); H (C, P); R (C, C); e (C,). Returns Diag.
    """
    v = bel.var
    SinvH = fd_gain_terms(v, H, R, singular)
    mean = bel.mean + v * (SinvH.T @ e)
    var = v - v**2 * np.einsum("cp,cp->p", H, SinvH)
    require_finite("FD-EKF mean update", mean)
    return Diag(mean, _positive(var, "FD-EKF"), dtype=bel.dtype)


def vd_update(bel, H, R, e, mean_rule="paper", singular=False):
    """VD-EKF update (Chang et al. 2022, eqs 13-14 and 25).

    Precision: 1/v'_i = 1/v_i + h_i^T R^{-1} h_i (the diagonal of the EKF precision).
    Mean, mean_rule="paper" (eq. 25): mu' = mu + v' * (H^T R^{-1} e).
    Mean, mean_rule="ekf": the exact EKF mean from the diagonal prior
    (the FD-EKF mean), mu' = mu + diag(v) H^T S^{-1} e.
    bel: Diag (P); H (C, P); R (C, C); e (C,). Returns Diag.
    """
    if mean_rule not in VD_MEAN_RULES:
        raise ValueError(f"mean_rule must be one of {VD_MEAN_RULES}; got {mean_rule!r}")
    v = bel.var
    G, g = whiten(H, R, e, singular=singular)
    var = _positive(1.0 / (1.0 / v + linalg.rowsumsq(G)), "VD-EKF")
    if mean_rule == "paper":
        mean = bel.mean + var * g
    else:
        mean = bel.mean + v * (fd_gain_terms(v, H, R, singular).T @ e)
    require_finite("VD-EKF mean update", mean)
    return Diag(mean, var, dtype=bel.dtype)


def block_predict(bel, gamma, q):
    """Predict step for a BlockDiag belief: Sigma_g <- gamma^2 Sigma_g + diag(q_g)."""
    q = np.broadcast_to(q, (bel.n_params,))
    covs = [gamma**2 * c + np.diag(q[g]) for g, c in zip(bel.groups, bel.covs)]
    return BlockDiag(gamma * bel.mean, bel.groups, tuple(covs))


def _block_S(bel, H, R):
    S = R.copy()
    for g, c in zip(bel.groups, bel.covs):
        Hg = H[:, g]
        S += Hg @ c @ Hg.T
    return linalg.symmetrize(S)


def fd_block_update(bel, H, R, e, singular=False):
    """Decoupled (block) EKF update: S = R + sum_g H_g Sigma_g H_g^T,
    K_g = Sigma_g H_g^T S^{-1}, mu_g += K_g e, Sigma_g -= K_g H_g Sigma_g.
    """
    SinvH = linalg.psd_solve(_block_S(bel, H, R), H, pinv=singular, name="innovation covariance S")
    mean = bel.mean.copy()
    covs = []
    for g, c in zip(bel.groups, bel.covs):
        K = c @ SinvH[:, g].T  # (b, C)
        mean[g] += K @ e
        covs.append(linalg.symmetrize(c - K @ H[:, g] @ c))
    for c in covs:
        _positive(np.diag(c), "FD-EKF block")
    require_finite("FD-EKF block mean update", mean)
    return BlockDiag(mean, bel.groups, tuple(covs))


def vd_block_update(bel, H, R, e, mean_rule="paper", singular=False):
    """Block VD-EKF: Sigma_g'^{-1} = Sigma_g^{-1} + H_g^T R^{-1} H_g, and
    mu_g' = mu_g + Sigma_g' H_g^T R^{-1} e ("paper") or the exact EKF mean ("ekf").
    """
    if mean_rule not in VD_MEAN_RULES:
        raise ValueError(f"mean_rule must be one of {VD_MEAN_RULES}; got {mean_rule!r}")
    G, g_vec = whiten(H, R, e, singular=singular)
    covs = []
    mean = bel.mean.copy()
    for idx, c in zip(bel.groups, bel.covs):
        b = len(idx)
        prec = linalg.psd_solve(c, np.eye(b), name="covariance block") + G[idx] @ G[idx].T
        cov = linalg.symmetrize(linalg.psd_solve(prec, np.eye(b), name="posterior precision block"))
        covs.append(cov)
        if mean_rule == "paper":
            mean[idx] += cov @ g_vec[idx]
    if mean_rule == "ekf":
        SinvH = linalg.psd_solve(_block_S(bel, H, R), H, pinv=singular, name="innovation covariance S")
        for idx, c in zip(bel.groups, bel.covs):
            mean[idx] += c @ (SinvH[:, idx].T @ e)
    for c in covs:
        _positive(np.diag(c), "VD-EKF block")
    require_finite("VD-EKF block mean update", mean)
    return BlockDiag(mean, bel.groups, tuple(covs))


class _DiagonalEKF(Filter):
    backends = ("numpy", "numba", "cuda")
    float32_backends = ("numba", "cuda")
    handles_missing = True

    def __init__(self, model: Model, likelihood: Likelihood, *, gamma: float = 1.0, q: ArrayLike = 0.0,
                 blocks: Sequence[ArrayLike] | None = None, backend: str = "numpy", dtype: Any = np.float64) -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, backend=backend, dtype=dtype)
        if blocks is not None and backend != "numpy":
            raise ValueError(f"block variants run on backend='numpy' only; got backend={backend!r}")
        if blocks is None:
            self.blocks = None
            self.belief_type = Diag
        else:
            self.blocks = tuple(np.asarray(b, dtype=np.intp).reshape(-1) for b in blocks)
            BlockDiag(np.zeros(self.n_params), self.blocks, tuple(np.eye(len(b)) for b in self.blocks))  # checks the partition
            self.belief_type = BlockDiag

    def init(self, mean: ArrayLike, prior_var: ArrayLike = 1.0) -> Diag | BlockDiag:
        mean, var = self._init_mean_var(mean, prior_var)
        if self.blocks is None:
            bel = Diag(mean, var, dtype=self.dtype)
            return self._on_device(bel) if self._device_spec() is not None else bel
        return BlockDiag(mean, self.blocks, tuple(np.diag(var[g]) for g in self.blocks))

    def _predict(self, bel):
        if _is_device(bel):  # the predict step of a belief on the GPU, on the GPU
            from ..device import predict_on_device

            return predict_on_device(self, bel)
        if self.blocks is None:
            return predict(bel, self.gamma, self.q)
        return block_predict(bel, self.gamma, self.q)

    # -- compiled one-call steps for MLPs (backend "numba") ---------------------------------------
    _mode = None  # "fd", "vd-paper" or "vd-ekf" (kernels.cpu.mlp_diag.MODES)

    def _kernel_diag(self, bel, mean, var):
        """The Diag of a kernel's (mean, var) on the host route, rounded to ``bel``'s dtype; back on the GPU
        when ``bel`` was there (a step that had to take the host route: missing outputs, say)."""
        out = Diag(mean, var, dtype=bel.dtype)
        return self._on_device(out) if _is_device(bel) else out

    def _device_spec(self):
        """Arguments of the GPU step (kernels.cuda.diag_step), or None where it does not apply: backend
        "cuda", no blocks, an MLP or Linear model, a Gaussian or categorical likelihood."""
        if "_dspec" not in self.__dict__:
            spec = None
            if self.backend == "cuda" and self.blocks is None:
                spec = mlp_kernel_spec(self.model, self.likelihood)
            self.__dict__["_dspec"] = spec
        return self.__dict__["_dspec"]

    def _device_step(self, bel, x, y, predict):
        """The GPU step (refbayes.device.step_on_device: kernels.cuda.diag_step.mlp_diag_step) on a belief
        moved to the GPU if it is not there yet, or None to take the general route."""
        spec = self._device_spec()
        if spec is None or not (type(bel) is Diag or _is_device(bel)):
            return None
        from ..device import step_on_device

        return step_on_device(self, spec, bel, x, y, predict, mode=self._mode)

    def _fused_step(self, bel, x, y, predict=False):
        """The compiled MLP step (kernels.cpu.mlp_diag, or kernels.cuda.diag_step on the GPU), or None
        where it does not apply (backend "numba" or "cuda", an MLP, a Gaussian or categorical likelihood)."""
        if self.backend == "cuda":
            return self._device_step(bel, x, y, predict)
        if "_mlp_spec" not in self.__dict__:
            self.__dict__["_mlp_spec"] = mlp_kernel_spec(self.model, self.likelihood) if self.backend == "numba" else None
        spec = self.__dict__["_mlp_spec"]
        if spec is None:
            return None
        from ..kernels.cpu.mlp_diag import mlp_diag_step

        x = self.model.validate_x(x)
        target = self.likelihood.encode(y, self.model.out_dim)
        gamma, q = (self.gamma, self.q) if predict else (1.0, 0.0)
        mean, var, yhat = mlp_diag_step(*spec, bel.mean, bel.var, x, target, self._mode, gamma=gamma, q=q)
        return Diag._trusted(mean=mean, var=var), yhat


class FDEKF(_DiagonalEKF):
    """Fully decoupled diagonal EKF (Chang, Jones & Murphy 2022, eqs 10-12): moment matching of
    the marginal variances. Belief: Diag, mean (P,) and variances (P,).

    Call ``FDEKF(model, likelihood, *, gamma=1.0, q=0.0, blocks=None, backend="numpy")``;
    gamma, q: dynamics theta_t = gamma theta_{t-1} + N(0, q I).

    blocks: optional partition of range(P) into index arrays; then the belief
    is BlockDiag and the update is the block-decoupled EKF.
    backend: "numpy" (reference), "numba" or "cuda" (compiled kernels; diagonal only). With
    "numba" on an MLP with a Gaussian or categorical likelihood, ``update``, ``predict_update``
    and ``scan`` run as one compiled call that never forms H (kernels.cpu.mlp_diag); with "cuda"
    on such a model the belief is a ``rb.DeviceDiag`` kept on the GPU and each step one chain of
    kernels (kernels.cuda.diag_step, docs/gpu.md).
    dtype: np.float64 (default) or np.float32 (backend "numba" or "cuda", diagonal only): the dtype
    of the beliefs' arrays; a float32 belief is computed on in float64 and stored in float32
    (docs/float32.md).
    """

    _mode = "fd"

    def _update(self, bel, lin):
        if self.kernels is not None:
            return self._kernel_diag(bel, *self.kernels.fd_update(bel.mean, bel.var, lin.H, lin.R, lin.e,
                                                                  singular=lin.singular))
        if self.blocks is None:
            return fd_update(bel, lin.H, lin.R, lin.e, singular=lin.singular)
        return fd_block_update(bel, lin.H, lin.R, lin.e, singular=lin.singular)


class VDEKF(_DiagonalEKF):
    """Variational diagonal EKF (Chang, Jones & Murphy 2022, eqs 13-14 and 25): matches the
    diagonal of the posterior precision. Keyword-only hyper-parameters as :class:`FDEKF`, plus:

    vd_mean: "ekf" (default) or "paper". "ekf" moves the mean by the exact EKF gain from the
    diagonal prior, mu' = mu + diag(v) H^T S^-1 e (the FD-EKF mean); "paper" is the paper's
    eq. 25, mu' = mu + v' H^T R^-1 e, which steps by the posterior variance times the whitened
    residual and overshoots when many coordinates share one observation: on the README's
    sine data (MLP 1-16-1, obs_var 0.01, 200 steps) it reaches weights of ~75 and a grid RMSE of
    ~150 where "ekf" gives 0.27, and with obs_var 1e-8 its mean passes 1e6 within a few steps.
    Pass vd_mean="paper" to reproduce the paper.
    backend: "numpy" (reference), "numba" or "cuda" (compiled kernels; diagonal only); "numba" on an
    MLP runs each step as one compiled call, as FDEKF does.
    dtype: np.float64 (default) or np.float32 (backend "numba" or "cuda"), as for FDEKF.
    """

    def __init__(self, model: Model, likelihood: Likelihood, *, gamma: float = 1.0, q: ArrayLike = 0.0,
                 vd_mean: str = "ekf", blocks: Sequence[ArrayLike] | None = None, backend: str = "numpy",
                 dtype: Any = np.float64) -> None:
        super().__init__(model, likelihood, gamma=gamma, q=q, blocks=blocks, backend=backend, dtype=dtype)
        if vd_mean not in VD_MEAN_RULES:
            raise ValueError(f"vd_mean must be one of {VD_MEAN_RULES}; got {vd_mean!r}")
        self.vd_mean = vd_mean
        self._mode = "vd-" + vd_mean

    def _update(self, bel, lin):
        if self.kernels is not None:
            return self._kernel_diag(bel, *self.kernels.vd_update(bel.mean, bel.var, lin.H, lin.R, lin.e,
                                                                  mean_rule=self.vd_mean, singular=lin.singular))
        if self.blocks is None:
            return vd_update(bel, lin.H, lin.R, lin.e, mean_rule=self.vd_mean, singular=lin.singular)
        return vd_block_update(bel, lin.H, lin.R, lin.e, mean_rule=self.vd_mean, singular=lin.singular)
