"""MC-HESS over the diagonal families for an MLP: the gradient and the Hutchinson estimate of the
Hessian's diagonal at one draw, from exact Hessian-vector products (Jones, Chang & Murphy 2024,
Alg. 4 and Sec. E.3).

At a draw theta, with probes z_1, ..., z_N (the columns of Z (P, N), Rademacher +-1), the reference
(``refbayes.filters.bong.estimators.mc_hess`` with ``curvature="hutchinson"``) forms g = grad l(theta)
and d = (1/N) sum_n z_n * (hess l(theta) z_n), l(theta) = log p(y | f(x, theta)), the products by
reverse-over-reverse autograd. Here each product comes from one forward and one reverse pass of
directional derivatives along z (Pearlmutter's R-operator, R{v} = d/dt v(theta + t z) at t = 0), all N
probes at once. For a unit u of layer l with inputs h~ = [h_{l-1}, 1], pre-activation
a_u = w_u . h~ and delta_u = dl/da_u:

    forward:   R{a_u} = z_u . h~ + w_u . R{h~},     R{h_u} = act'(a_u) R{a_u}    (R{x} = 0),
    output:    R{delta_c} = sum_c' Lambda_cc' R{eta_c'},   Lambda = d^2 log p / d eta^2,
    reverse:   e_k = sum_u w_uk delta_u,   R{e_k} = sum_u (z_uk delta_u + w_uk R{delta_u}),
               R{delta_k} = act''(a_k) R{a_k} e_k + act'(a_k) R{e_k},
    product:   (hess l z) at weight (u, k) = R{delta_u} h~_k + delta_u R{h~_k}, at a bias R{delta_u},

where w_u, z_u are the unit's weights and their probe entries, and the output layer is linear
(eta = a_L). Lambda is -R^{-1} (Gaussian, the matrix ``Gaussian.hessian`` returns) or
-(diag(p) - p p^T) with p = softmax(eta) over all K logits (categorical). act'' from h = act(a):
tanh -2 h (1 - h^2), sigmoid h (1 - h)(1 - 2 h), elu 0 for a > 0 (h > 0) else h + 1 (the model's
``where(a > 0, ...)`` at a = 0 takes the exponential branch), relu and linear 0.

The sums over n are the reference's (1/N) sum_n z_n * (H z_n) entry by entry, in another order: the
numbers agree to round-off. Cost per draw: about 6 N multiply-adds per weight (the reference: N
reverse-over-reverse passes through autograd).
"""

import numba
import numpy as np

from ._status import BAD_ESTIMATE, OK
from ._blocks import REDUCE, nonfinite_vec
from .bong_mlp import _loglik_grad_units, _unit_offsets
from .mlp import _offsets
from .step import log_sum_exp

__all__ = ["hutchinson_draw", "mlp_mc_hess_draw"]


@numba.njit(cache=True, error_model="numpy")
def _act2(code, h, dact):
    """act''(a) from h = act(a) and dact = act'(a) (codes of ``mlp.ACTIVATION_CODES``)."""
    if code == 0:  # tanh
        return -2.0 * h * dact
    if code == 2:  # sigmoid
        return dact * (1.0 - 2.0 * h)
    if code == 3:  # elu: exp(a) = h + 1 where a <= 0, that is where h <= 0
        return 0.0 if h > 0.0 else h + 1.0
    return 0.0  # relu, linear


@numba.njit(nogil=True, cache=True, fastmath=REDUCE, error_model="numpy")
def hutchinson_draw(theta, B, x, target, sizes, bias, act, lik, Rinv, Lam, out_g, out_d):
    """Adds g = grad l(theta) to out_g and sum_n z_n * (hess l(theta) z_n) (not yet divided by N) to
    out_d, for the probes Z = 2 B - 1 (see the module), B (P, N) integers 0 or 1 as
    ``rng.integers(0, 2, ...)`` draws them (mapped to +-1 here, which saves the host two passes).
    Rinv: the Gaussian R^{-1} of the gradient; Lam: the Gaussian Hessian in eta (both unused for a
    categorical likelihood). Returns OK, BAD_MODEL (a non-finite model output or likelihood gradient
    at theta) or BAD_ESTIMATE (out_g or out_d not finite afterwards). Releases the GIL (nogil):
    the host runs one draw's call on a worker while it draws the next draw's probes."""
    N = B.shape[1]
    nl = sizes.shape[0] - 1
    w0, b0, hs, _, nh = _offsets(sizes, bias)
    os = _unit_offsets(sizes)
    NO = os[nl]
    h = np.empty(nh)
    dact = np.empty(nh)
    gam = np.empty(NO)  # delta_u = dl/da_u
    status = _loglik_grad_units(theta, x, target, sizes, bias, act, lik, Rinv, w0, b0, hs, os, h, dact, gam)
    if status != OK:
        return status
    # forward: R{a_u} for every unit (rows of Ra) and R{h} of every layer's outputs (rows of Rh, the
    # layout of h; the network's inputs, rows 0 .. n_0 - 1, are never read)
    Ra = np.empty((NO, N))
    Rh = np.empty((nh, N))
    for l in range(nl):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        for j in range(sizes[l + 1]):
            u = os[l] + j
            ra = Ra[u]
            if bias:
                zb = B[b0[l] + j]
                for n in range(N):
                    ra[n] = 2.0 * zb[n] - 1.0
            else:
                for n in range(N):
                    ra[n] = 0.0
            base = w0[l] + j * n_in
            for k in range(n_in):
                zk = B[base + k]
                hk = hl[k]
                if l == 0:
                    for n in range(N):
                        ra[n] += (2.0 * zk[n] - 1.0) * hk
                else:
                    wk = theta[base + k]
                    rk = Rh[hs[l] + k]
                    for n in range(N):
                        ra[n] += (2.0 * zk[n] - 1.0) * hk + wk * rk[n]
            o = hs[l + 1] + j
            d = dact[o]  # 1 at the linear output layer
            ro = Rh[o]
            for n in range(N):
                ro[n] = d * ra[n]
    # output: R{delta} = Lambda R{eta}
    Cf = sizes[nl]
    eta = h[hs[nl]:hs[nl] + Cf]
    Reta = Rh[hs[nl]:hs[nl] + Cf]
    RD = np.empty((NO, N))  # R{delta_u}
    o0 = os[nl - 1]
    if lik == 0:
        for c in range(Cf):
            rd = RD[o0 + c]
            for n in range(N):
                rd[n] = 0.0
            for c2 in range(Cf):
                lc = Lam[c, c2]
                re = Reta[c2]
                for n in range(N):
                    rd[n] += lc * re[n]
    else:
        lse = log_sum_exp(eta)
        p = np.empty(Cf)
        for c in range(Cf):  # softmax(eta), as the gradient's (bong_mlp._loglik_grad_units)
            p[c] = np.exp(eta[c] - lse)
        pr = np.zeros(N)  # p^T R{eta}
        for c in range(Cf):
            pc = p[c]
            re = Reta[c]
            for n in range(N):
                pr[n] += pc * re[n]
        for c in range(Cf):  # -(diag(p) - p p^T) R{eta}
            pc = p[c]
            re = Reta[c]
            rd = RD[o0 + c]
            for n in range(N):
                rd[n] = -pc * (re[n] - pr[n])
    # reverse: R{delta} of each hidden layer from the layer above; the products, summed against Z
    e = np.empty(int(np.max(sizes)))
    Re = np.empty((int(np.max(sizes)), N))
    for l in range(nl - 1, -1, -1):
        n_in = sizes[l]
        hl = h[hs[l]:hs[l] + n_in]
        if l > 0:
            for k in range(n_in):
                e[k] = 0.0
                rek = Re[k]
                for n in range(N):
                    rek[n] = 0.0
        for j in range(sizes[l + 1]):
            u = os[l] + j
            du = gam[u]
            rd = RD[u]
            base = w0[l] + j * n_in
            for k in range(n_in):
                i = base + k
                zk = B[i]
                hk = hl[k]
                out_g[i] += hk * du
                acc = 0.0
                if l == 0:
                    for n in range(N):
                        acc += (2.0 * zk[n] - 1.0) * (rd[n] * hk)
                else:
                    rh = Rh[hs[l] + k]
                    for n in range(N):
                        acc += (2.0 * zk[n] - 1.0) * (rd[n] * hk + du * rh[n])
                    wk = theta[i]
                    e[k] += wk * du
                    rek = Re[k]
                    for n in range(N):
                        rek[n] += (2.0 * zk[n] - 1.0) * du + wk * rd[n]
                out_d[i] += acc
            if bias:
                i = b0[l] + j
                zb = B[i]
                out_g[i] += du
                acc = 0.0
                for n in range(N):
                    acc += (2.0 * zb[n] - 1.0) * rd[n]
                out_d[i] += acc
        if l > 0:
            for k in range(n_in):  # the units of layer l - 1
                o = hs[l] + k
                u = os[l - 1] + k
                d1 = dact[o]
                d2 = _act2(act, h[o], d1)
                ra = Ra[u]
                rek = Re[k]
                rd = RD[u]
                ek = e[k]
                for n in range(N):
                    rd[n] = d2 * ra[n] * ek + d1 * rek[n]
    if nonfinite_vec(out_g) or nonfinite_vec(out_d):
        return BAD_ESTIMATE
    return OK


def mlp_mc_hess_draw(sizes, activation, likelihood, Rinv, Lam, theta, B, x, target, out_g, out_d, bias):
    """``hutchinson_draw`` for one draw theta (P,) and probe bits B (P, N) (``rng.integers(0, 2, (P, N))``,
    the probes 2 B - 1), from the host: adds the draw's gradient to out_g and sum_n z_n * (H z_n) to
    out_d (both (P,)). Returns the status (``_status``)."""
    B = np.asarray(B)
    if B.dtype != np.int64 or B.ndim != 2 or B.shape[0] != theta.shape[0]:
        raise ValueError(f"B must be int64 of shape ({theta.shape[0]}, N); got {B.dtype} {B.shape}")
    return int(hutchinson_draw(np.ascontiguousarray(theta, dtype=np.float64), np.ascontiguousarray(B), x, target,
                               sizes, bool(bias), activation, likelihood, Rinv, Lam, out_g, out_d))
