"""Inner steps of BONG, BLR, BOG and BBB for each variational family.

Jones, Chang & Murphy (2024), Appendix E. Every step has the signature

    step(cur, prior, g, curv, alpha) -> new belief

with ``cur`` the current iterate psi_{t,i-1}, ``prior`` the predicted belief
psi_{t|t-1}, g (P,) and curv (a Curvature) the estimates of E[grad log p] and
E[hess log p] at ``cur``, and alpha the learning rate.

- BONG: one natural-gradient (mirror-descent) step on E_q[log p] from the prior.
  The paper fixes alpha = 1; other alpha give "BONG with step alpha", which
  equals one BLR iteration.
- BLR: natural-gradient steps on E_q[log p] - KL(q || prior) from the current iterate.
- BOG: one plain gradient step on E_q[log p] from the prior, in the family's parameters.
- BBB: plain gradient steps on E_q[log p] - KL(q || prior) from the current iterate.

BLR and BBB see the KL term through v = g + Lambda_p (mu_p - mu), the mean
gradient of the VI objective, and G - Lambda_p + Lambda, twice its covariance
gradient; both reduce to (g, G) at the prior, so BLR(alpha = 1, one
iteration) = BONG and BBB(one iteration) = BOG.

Unsubscripted mu, Sigma, Lambda, s, lambda, ups, W are the current iterate;
"_p" marks the prior. All diagonal operations are elementwise.
"""

import numpy as np
import scipy.linalg as sla

from ... import linalg
from ...errors import DivergenceError, NotPositiveDefiniteError
from .families import (
    FactorBound,
    PredictedFull,
    carried_factor,
    carry_factor,
    covariance_from_precision,
    diag_belief,
    dlr_belief,
    dlr_matvec,
    dlr_project,
    full_belief,
    full_belief_fast,
    full_cov_downdate_bound,
    full_cov_times,
    full_cov_update,
    precision_of,
    unformed,
)

__all__ = ["ALGORITHMS", "STEPS", "get_step", "supports", "full_one_step"] + [
    f"{f}_{a}"
    for f in ("full_natural", "full", "diag_natural", "diag", "dlr")
    for a in ("bong", "blr", "bog", "bbb")
]

ALGORITHMS = ("bong", "blr", "bog", "bbb")


# ============================================================================================
# Full covariance, natural parameters (paper App. E.1)


def _times_factor_and_g(prior, U, g, coef):
    """(Sigma_p U, Sigma_p g) in one product call; with ``coef`` (g = U coef, as a factor estimate
    carries it) Sigma_p g = (Sigma_p U) coef, one product column fewer."""
    K = U.shape[1]
    if coef is not None:
        SU = full_cov_times(prior, U)
        return SU, SU @ coef
    SUg = full_cov_times(prior, np.column_stack([U, g]))
    return SUg[:, :K], SUg[:, K]


def full_natural_bong(cur, prior, g, curv, alpha=1.0, coef=None):
    """BONG, FC natural (Jones et al. 2024, eqs 120-121; explicit R-VGA).

    Lambda+ = Lambda_p - alpha G,  mu+ = mu_p + alpha Sigma+ g.
    For a factor G = -U U^T the Woodbury form (eqs 122-127) costs O(K P^2):
    Sigma+ = Sigma_p - Sigma_p U (I/alpha + U^T Sigma_p U)^{-1} U^T Sigma_p.
    With LIN-HESS this is the EKF (eqs 128-132). FullCov (or families.PredictedFull) -> FullCov.
    coef: optional (K,) with g = U coef (the estimate's), for a factor only; saves a product.
    """
    if curv.is_factor:
        # O(K P^2): Sigma+ = Sigma_p - B^T B, B = L^{-1} U^T Sigma_p, L L^T = I + U^T Sigma_p U.
        # Symmetric (linalg.lowrank_update); positive definite whenever Sigma_p is and the K x K
        # Cholesky succeeds (Woodbury), so only O(P) checks follow. Sigma_p is read through
        # products (full_cov_times: [Sigma_p U, Sigma_p g] in one call) and one update pass, and
        # Sigma+ g = Sigma_p g - B^T (B g) needs no pass over Sigma+.
        U = np.sqrt(alpha) * curv.factor()
        K = U.shape[1]
        SU, Sg = _times_factor_and_g(prior, U, g, None if coef is None else coef / np.sqrt(alpha))
        L = linalg.cholesky(np.eye(K) + U.T @ SU, "I + U^T Sigma_p U")
        B = sla.solve_triangular(L, SU.T, lower=True, check_finite=False)
        cov = full_cov_update(prior, B)
        return full_belief_fast(prior.mean + alpha * (Sg - B.T @ (B @ g)), cov, "BONG covariance")
    S = prior.cov
    prec = precision_of(S, "prior covariance") - alpha * curv.dense()
    cov = covariance_from_precision(prec, "BONG posterior precision")
    cov = linalg.symmetrize(cov)
    return full_belief(prior.mean + alpha * (cov @ g), cov, "BONG covariance")


def full_natural_blr(cur, prior, g, curv, alpha):
    """BLR, FC natural (Jones et al. 2024, eqs 135-136). O(P^3).

    Lambda+ = (1 - alpha) Lambda + alpha Lambda_p - alpha G,
    mu+ = mu + alpha Sigma+ v,  v = g + Lambda_p (mu_p - mu).
    """
    lam = precision_of(cur.cov, "current covariance")
    lam_p = precision_of(prior.cov, "prior covariance")
    v = g + lam_p @ (prior.mean - cur.mean)
    prec = (1.0 - alpha) * lam + alpha * lam_p - alpha * curv.dense()
    cov = covariance_from_precision(prec, "BLR posterior precision")
    return full_belief(cur.mean + alpha * (cov @ v), cov, "BLR covariance")


def _natural_gd(lam, mean, grad_mean, SGS, alpha, symmetrize, what):
    """One gradient step on (psi1, psi2) = (Lambda mu, -Lambda/2) given dE/dmu and S G S.

    dE/dpsi1 = Sigma grad_mean; dE/dpsi2 = 2 Sigma grad_mean mu^T + Sigma G Sigma
    (eqs 114-115); symmetrize=True uses the symmetric-matrix gradient
    Sigma grad mu^T + mu grad^T Sigma + Sigma G Sigma.
    """
    a = linalg.psd_solve(lam, grad_mean, name=f"{what} current precision")  # Sigma grad_mean
    outer = np.outer(a, mean)
    if symmetrize:
        prec = lam - 2.0 * alpha * (outer + outer.T) - 2.0 * alpha * SGS
    else:
        prec = lam - 4.0 * alpha * outer - 2.0 * alpha * SGS
    psi1 = lam @ mean + alpha * a
    if symmetrize:
        prec = linalg.symmetrize(prec)
        cov = covariance_from_precision(prec, f"{what} posterior precision")
        return full_belief(cov @ psi1, cov, f"{what} covariance")
    # The paper's non-symmetric precision: mean from it; store the symmetric part of its inverse.
    if not np.all(np.isfinite(prec)):
        raise DivergenceError(f"{what} update produced NaN or inf (overflow)", quantity=what)
    cov = np.linalg.inv(prec)
    return full_belief(cov @ psi1, linalg.symmetrize(cov), f"{what} covariance")


def full_natural_bog(cur, prior, g, curv, alpha, symmetrize=True, coef=None):
    """BOG, FC natural (Jones et al. 2024, eqs 141-142). O(P^3); O((K + 2) P^2) for a factor G = -U U^T
    with symmetrize=True (the Woodbury form, no P x P factorisation).

    Lambda+ = Lambda_p - 2 alpha (Sigma_p g mu_p^T + mu_p g^T Sigma_p) - 2 alpha Sigma_p G Sigma_p,
    mu+ = Sigma+ (Lambda_p mu_p + alpha Sigma_p g).
    symmetrize=False uses the paper's term -4 alpha Sigma_p g mu_p^T (a
    non-symmetric precision); the mean then follows it exactly and the stored
    covariance is the symmetric part of its inverse. coef: optional (K,) with g = U coef (a
    factor estimate's), which saves two product columns in the Woodbury form.
    """
    if symmetrize and curv.is_factor:
        return _natural_bog_woodbury(prior, g, curv.factor(), alpha, coef)
    S = prior.cov
    lam_p = precision_of(S, "prior covariance")
    return _natural_gd(lam_p, prior.mean, g, curv.sandwich(S), alpha, symmetrize, "BOG")


def _natural_bog_woodbury(prior, g, U, alpha, coef=None):
    """BOG, FC natural, symmetric gradient, G = -U U^T, in O((K + 2) P^2) without Lambda_p.

    The precision update of eq. 141 is of rank K + 2: Lambda+ = Lambda_p + V D V^T with
    V = [a, mu_p, Sigma_p U], a = Sigma_p g, D = 2 alpha ([[0, -1], [-1, 0]] + I_K).
    Woodbury: Sigma+ = Sigma_p - W C^{-1} W^T, W = Sigma_p V, C = D^{-1} + V^T W (symmetric,
    indefinite); mu+ = Sigma+ (Lambda_p mu_p + alpha a) = mu_p - W C^{-1} V^T mu_p + alpha Sigma+ a.
    Definiteness (Haynsworth inertia): Lambda+ is positive definite iff C has exactly as many
    positive eigenvalues as D^{-1} (K + 1), checked from the (K + 2) x (K + 2) eigenvalues of C.
    Sigma+ is built as Sigma_p - Zp Zp^T + Zn Zn^T in one pass (linalg.lowrank_update): symmetric.
    Sigma_p is read through two product calls (full_cov_times: [Sigma_p U, a], then W) and the
    update pass; Sigma+ a = W[:, 0] - Zp (Zp^T a) + Zn (Zn^T a) needs no pass over Sigma+.
    With coef (g = U coef): a = (Sigma_p U) coef and Sigma_p a = (Sigma_p^2 U) coef, so the
    products are Sigma_p U (K columns), then Sigma_p [Sigma_p U, mu_p] (K + 1).
    """
    mu = prior.mean
    K = U.shape[1]
    SU, a = _times_factor_and_g(prior, U, g, coef)
    V = np.column_stack([a, mu, SU])
    if coef is None:
        W = full_cov_times(prior, V)
    else:
        SSU_mu = full_cov_times(prior, np.column_stack([SU, mu]))
        W = np.column_stack([SSU_mu[:, :K] @ coef, SSU_mu[:, K], SSU_mu[:, :K]])
    Dinv = np.zeros((K + 2, K + 2))
    Dinv[0, 1] = Dinv[1, 0] = -0.5 / alpha
    Dinv[2:, 2:] = np.eye(K) * (0.5 / alpha)
    C = V.T @ W
    C = 0.5 * (C + C.T) + Dinv
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(W))):
        raise DivergenceError("BOG update produced NaN or inf (overflow)", quantity="BOG update")
    lam, Q = np.linalg.eigh(C)
    tol = 1e-12 * np.abs(lam).max(initial=0.0)
    if np.any(np.abs(lam) <= tol) or int(np.sum(lam > 0)) != K + 1:
        raise NotPositiveDefiniteError("BOG posterior precision is not positive definite")
    Z = W @ Q
    # eigh's eigenvalues ascend, and exactly one is negative (checked above): it comes first
    Zn = Z[:, :1] / np.sqrt(-lam[:1])
    Zp = Z[:, 1:] / np.sqrt(lam[1:])
    cov = full_cov_update(prior, Zp.T, plus=Zn.T)
    cov_a = W[:, 0] - Zp @ (Zp.T @ a) + Zn @ (Zn.T @ a)  # Sigma+ a, W[:, 0] = Sigma_p a
    mean = mu - W @ np.linalg.solve(C, V.T @ mu) + alpha * cov_a
    return full_belief_fast(mean, cov, "BOG covariance")


def full_natural_bbb(cur, prior, g, curv, alpha, symmetrize=True):
    """BBB, FC natural (Jones et al. 2024, eqs 147-148). O(P^3).

    Lambda+ = Lambda - 2 alpha (Sigma v mu^T + mu v^T Sigma) - 2 alpha Sigma (G - Lambda_p) Sigma - 2 alpha Sigma,
    mu+ = Sigma+ (Lambda mu + alpha Sigma v), v = g + Lambda_p (mu_p - mu).
    symmetrize as in :func:`full_natural_bog`.
    """
    S = cur.cov
    lam = precision_of(S, "current covariance")
    lam_p = precision_of(prior.cov, "prior covariance")
    v = g + lam_p @ (prior.mean - cur.mean)
    SGS = curv.sandwich(S) - S @ lam_p @ S + S
    return _natural_gd(lam, cur.mean, v, SGS, alpha, symmetrize, "BBB")


# ============================================================================================
# Full covariance, moment parameters (paper App. E.2)


def full_bong(cur, prior, g, curv, alpha=1.0, coef=None):
    """BONG, FC moment (Jones et al. 2024, eqs 169-170). O(K P^2) for a factor.

    mu+ = mu_p + alpha Sigma_p g,  Sigma+ = Sigma_p + alpha Sigma_p G Sigma_p.
    coef: optional (K,) with g = U coef (a factor estimate's); saves a product column.
    """
    if curv.is_factor:
        # O(K P^2): Sigma+ = Sigma_p - alpha (Sigma_p U)(Sigma_p U)^T (linalg.lowrank_update).
        # Sigma+ = Sigma_p^{1/2} (I - alpha Sigma_p^{1/2} U U^T Sigma_p^{1/2}) Sigma_p^{1/2} is
        # positive definite iff I - alpha U^T Sigma_p U is: a K x K Cholesky guards it exactly.
        # [Sigma_p U, Sigma_p g] in one product call (full_cov_times), then one update pass.
        U = curv.factor()
        K = U.shape[1]
        SU, Sg = _times_factor_and_g(prior, U, g, coef)
        linalg.cholesky(np.eye(K) - alpha * (U.T @ SU), "BONG (moment) covariance")
        cov = full_cov_update(prior, np.sqrt(alpha) * SU.T)
        return full_belief_fast(prior.mean + alpha * Sg, cov, "BONG (moment) covariance")
    S = prior.cov
    return full_belief(prior.mean + alpha * (S @ g), S + alpha * curv.sandwich(S), "BONG (moment) covariance")


def full_blr(cur, prior, g, curv, alpha):
    """BLR, FC moment (Jones et al. 2024, eqs 173-174). O(P^3).

    mu+ = mu + alpha Sigma v,  Sigma+ = Sigma + alpha Sigma (G - Lambda_p + Lambda) Sigma
    = (1 + alpha) Sigma + alpha Sigma (G - Lambda_p) Sigma.
    """
    S = cur.cov
    lam_p = precision_of(prior.cov, "prior covariance")
    v = g + lam_p @ (prior.mean - cur.mean)
    cov = S + alpha * (curv.sandwich(S) - S @ lam_p @ S + S)
    return full_belief(cur.mean + alpha * (S @ v), cov, "BLR (moment) covariance")


def full_bog(cur, prior, g, curv, alpha, coef=None):
    """BOG, FC moment (Jones et al. 2024, eqs 177-178). The mean step is online gradient descent.

    mu+ = mu_p + alpha g,  Sigma+ = Sigma_p + (alpha / 2) G. For a factor G = -U U^T: one update
    pass, O(K P^2), and a definiteness certificate (:func:`_certify_bog`): a bound carried from step to
    step, shown by a triangular solve with its factor, O(K P^2), once a first P x P factorisation,
    O(P^3), has started the chain; with the compiled pass on two or more threads the solve runs beside
    the pass (:func:`_update_beside_bound`). O(P^3) for a dense G.
    coef is accepted for a uniform signature (the step never forms Sigma_p g).
    """
    if curv.is_factor:
        # Sigma+ = Sigma_p - c U U^T, c = alpha / 2, in one update pass (linalg.lowrank_update). The
        # step needs no factorisation (mu+ does not involve Sigma), but whether this downdate keeps
        # Sigma+ positive definite (I - c U^T Sigma_p^{-1} U > 0, a solve with Sigma_p) needs a factor
        # of Sigma_p or of a lower bound of it: see _certify_bog.
        U = curv.factor()
        c = 0.5 * alpha
        Bt = np.sqrt(c) * U.T
        base, scale = _base_and_scale(prior)
        bound = carried_factor(base)
        if bound is None:
            # the certificate starts with Sigma+'s Gershgorin bound: taken in the pass that writes Sigma+
            cov, low = full_cov_downdate_bound(prior, Bt)
            bel = full_belief_fast(prior.mean + alpha * g, cov, "BOG (moment) covariance")
            _certify_bog(bel, prior, c, U, low)
            return bel
        cov, new = _update_beside_bound(prior, Bt, bound, float(np.sqrt(scale)))
        bel = full_belief_fast(prior.mean + alpha * g, cov, "BOG (moment) covariance")
        _carry_or_decide(bel, new)
        return bel
    return full_belief(prior.mean + alpha * g, prior.cov + 0.5 * alpha * curv.dense(), "BOG (moment) covariance")


# the carried bound must show B+ >= DOWNDATE_TOL a^2 R^T R (the smallest eigenvalue of I - G above it), or,
# on a step that downdates the factor, keep every pivot r_j^2 above DOWNDATE_TOL R_jj^2
# (families.FactorBound.downdated; the rounding of the bounds stays orders of magnitude below it); where it
# does not, the exact factorisation decides
DOWNDATE_TOL = float(np.sqrt(np.finfo(np.float64).eps))


def _certify_bog(bel, prior, c, U, low=None):
    """Raise NotPositiveDefiniteError unless bel.cov = Sigma_p - c U U^T is positive definite, for a base
    belief that carries no bound yet, and start the chain of bounds; once one is carried, ``full_bog``
    takes its route itself (:func:`_update_beside_bound`, :func:`_carry_or_decide`), O(K P^2).

    Sigma_p = gamma^2 Sigma + diag(q) >= gamma^2 B for any B <= Sigma (q >= 0), so if the base belief
    (the one ``prior`` predicts from) carries such a B (``families.carried_factor``, a
    ``families.FactorBound``: B = a^2 (R^T R - X^T X) with R an upper Cholesky factor), then
    B+ = gamma^2 B - c U U^T bounds Sigma+ from below, and B+ shown positive definite proves Sigma+ so;
    B+ is then carried to the new belief. ``FactorBound.downdated`` shows it from one triangular solve
    with R (O(K P^2), a read of R) and the eigenvalues of an m x m matrix, m < ``families.FLUSH_ROWS``;
    the step that reaches FLUSH_ROWS rows downdates R by all of them instead
    (``kernels.cpu.cholupdate.chol_downdate``, whose pivots decide). Without q, B = Sigma along the
    whole chain and the certificate is exact.
    A base without a bound is first tried with two Gershgorin certificates
    (:func:`_gershgorin_certifies`, one read of a P x P matrix each); where they fail, its covariance is
    factorised once, O(P^3), and the chain starts there. Where the bound does not show B+ >=
    DOWNDATE_TOL a^2 R^T R, or a downdate pivot falls to DOWNDATE_TOL of its square (the bound too
    weak, or Sigma+ near singular or indefinite), the Cholesky
    factorisation of Sigma+ decides, O(P^3), raises if it fails, and restarts the chain from Sigma+ itself.
    low: Sigma+'s Gershgorin bound where the caller has it (``families.full_cov_downdate_bound``).
    """
    if _gershgorin_certifies(bel.cov, prior, c, U, low):
        return
    base, scale = _base_and_scale(prior)
    bound = FactorBound(np.ascontiguousarray(linalg.cholesky(base.cov, "prior covariance").T))
    carry_factor(base, bound)
    _carry_or_decide(bel, bound.downdated(float(np.sqrt(scale)), np.sqrt(c) * U.T, DOWNDATE_TOL))


def _carry_or_decide(bel, new):
    """Carry ``new`` (the downdated bound, shown positive definite) for ``bel``; where it is None, the Cholesky
    factorisation of bel.cov decides (raises NotPositiveDefiniteError, with what to change, if it fails) and
    its factor starts the chain again."""
    if new is None:
        try:
            R = linalg.cholesky(bel.cov, "BOG (moment) covariance")
        except NotPositiveDefiniteError as exc:
            raise NotPositiveDefiniteError(
                "BOG (moment) covariance is not positive definite: the step Sigma_p - (lr / 2) U U^T took more "
                "than Sigma_p holds along some direction (a smaller lr keeps it positive definite)") from exc
        new = FactorBound(np.ascontiguousarray(R.T))
    carry_factor(bel, new)


def _update_beside_bound(prior, Bt, bound, f):
    """(full_cov_update(prior, Bt), bound.downdated(f, Bt, DOWNDATE_TOL)): Sigma+ and the downdated bound
    (None where it is not shown), each as computed alone. With the compiled pass on two or more kernel
    threads the bound's solve runs on one of them while the pass runs on the others (neither needs the
    other's result; each row of the pass is made by one thread, so its numbers do not depend on the count)."""
    from refbayes.kernels import _host
    from refbayes.kernels.cpu.cholupdate import COPY_FIRST_P
    from refbayes.threads import kernel_threads

    nt = _host.n_threads()
    if nt < 2 or not getattr(prior, "compiled", False) or bound.R.shape[0] < COPY_FIRST_P:
        return full_cov_update(prior, Bt), bound.downdated(f, Bt, DOWNDATE_TOL)
    beside = _host.side_pool().submit(bound.downdated, f, Bt, DOWNDATE_TOL)
    with kernel_threads(nt - 1):
        cov = full_cov_update(prior, Bt)
    return cov, beside.result()


def _base_and_scale(prior):
    """(the belief a PredictedFull ``prior`` predicts from, gamma^2), or (prior, 1.0) for a FullCov: the belief
    whose carried factor bounds Sigma_p, and the factor's scale."""
    return (prior.base, prior.scale) if isinstance(prior, PredictedFull) else (prior, 1.0)


def _gershgorin_lower(S, block=64):
    """min_i (S_ii - sum_{j != i} |S_ij|), a lower bound on the eigenvalues of the symmetric S (P, P)
    (Gershgorin), in one read of S by blocks of rows (no P x P temporary)."""
    low = np.inf
    d = np.diagonal(S)
    for r in range(0, S.shape[0], block):
        low = min(low, float(np.min(2.0 * d[r:r + block] - np.abs(S[r:r + block]).sum(axis=1))))
    return low


def _gershgorin_certifies(S, prior, c, U, low=None):
    """Whether one of two Gershgorin certificates proves S = Sigma_p - c U U^T (P, P) positive definite
    (prior: the FullCov or PredictedFull of Sigma_p, U (P, K)), each one read of a P x P matrix: S's
    smallest Gershgorin bound is positive (S strictly diagonally dominant with a positive diagonal),
    or the prior's bound exceeds c |U|_2^2 (then S >= (bound - c |U|_2^2) I). False decides nothing.
    low: S's bound where it is known (then S is not read)."""
    if (_gershgorin_lower(S) if low is None else low) > 0.0:
        return True
    return _prior_gershgorin(prior) > c * np.linalg.eigvalsh(U.T @ U)[-1]


def _prior_gershgorin(prior):
    """The Gershgorin lower bound of Sigma_p for a FullCov or PredictedFull ``prior``, without forming
    Sigma_p = gamma^2 Sigma + diag(q): then gamma^2 bound(Sigma) + min(q), a lower bound of bound(Sigma_p)."""
    if not unformed(prior):
        return _gershgorin_lower(prior.cov)
    return prior.scale * _gershgorin_lower(prior.base.cov) + (0.0 if prior.q is None else float(np.min(prior.q)))


def full_bbb(cur, prior, g, curv, alpha):
    """BBB, FC moment (Jones et al. 2024, eqs 181-182). O(P^3).

    mu+ = mu + alpha v,  Sigma+ = Sigma + (alpha / 2) (G - Lambda_p + Lambda).
    """
    lam = precision_of(cur.cov, "current covariance")
    lam_p = precision_of(prior.cov, "prior covariance")
    v = g + lam_p @ (prior.mean - cur.mean)
    cov = cur.cov + 0.5 * alpha * (curv.dense() - lam_p + lam)
    return full_belief(cur.mean + alpha * v, cov, "BBB (moment) covariance")


# ============================================================================================
# Diagonal, natural parameters (paper App. E.3); d = diag(G)


def diag_natural_bong(cur, prior, g, curv, alpha=1.0, vdekf_mean=False):
    """BONG, diagonal natural (Jones et al. 2024, eqs 212-213; LIN-HESS: eqs 214-215, VD-EKF).

    lambda+ = lambda_p - alpha d,  mu+ = mu_p + alpha g / lambda+.
    vdekf_mean=True (a factor G = -U U^T only) uses the full-gain mean of the
    authors' code, mu+ = mu_p + alpha (diag(lambda_p) + alpha U U^T)^{-1} g,
    which with LIN-HESS is the EKF mean from the diagonal prior.
    """
    lam_p = 1.0 / prior.var
    lam = lam_p - alpha * curv.diag()
    if vdekf_mean:
        step = linalg.dlr_solve(lam_p, np.sqrt(alpha) * curv.factor(), g)
    else:
        step = g / lam
    return diag_belief(prior.mean + alpha * step, 1.0 / lam, "BONG (diag) precision")


def diag_natural_blr(cur, prior, g, curv, alpha):
    """BLR, diagonal natural (Jones et al. 2024, eqs 218-219; online VON).

    lambda+ = (1 - alpha) lambda + alpha lambda_p - alpha d,  mu+ = mu + alpha v / lambda+,
    v = g + lambda_p (mu_p - mu).
    """
    lam_p = 1.0 / prior.var
    v = g + lam_p * (prior.mean - cur.mean)
    lam = (1.0 - alpha) / cur.var + alpha * lam_p - alpha * curv.diag()
    return diag_belief(cur.mean + alpha * v / lam, 1.0 / lam, "BLR (diag) precision")


def diag_natural_bog(cur, prior, g, curv, alpha):
    """BOG, diagonal natural (Jones et al. 2024, eqs 224-225).

    lambda+ = lambda_p - 4 alpha s_p mu_p g - 2 alpha s_p^2 d,
    mu+ = (lambda_p mu_p + alpha s_p g) / lambda+.
    """
    s_p, mu_p = prior.var, prior.mean
    lam = 1.0 / s_p - 4.0 * alpha * s_p * mu_p * g - 2.0 * alpha * s_p**2 * curv.diag()
    return diag_belief((mu_p / s_p + alpha * s_p * g) / lam, 1.0 / lam, "BOG (diag) precision")


def diag_natural_bbb(cur, prior, g, curv, alpha):
    """BBB, diagonal natural (Jones et al. 2024, eqs 230-231).

    lambda+ = lambda - 4 alpha s mu v - 2 alpha s^2 (d - lambda_p) - 2 alpha s,
    mu+ = (lambda mu + alpha s v) / lambda+,  v = g + lambda_p (mu_p - mu).
    """
    s, mu = cur.var, cur.mean
    lam_p = 1.0 / prior.var
    v = g + lam_p * (prior.mean - mu)
    lam = 1.0 / s - 4.0 * alpha * s * mu * v - 2.0 * alpha * s**2 * (curv.diag() - lam_p) - 2.0 * alpha * s
    return diag_belief((mu / s + alpha * s * v) / lam, 1.0 / lam, "BBB (diag) precision")


# ============================================================================================
# Diagonal, moment parameters (paper App. E.4)


def diag_bong(cur, prior, g, curv, alpha=1.0):
    """BONG, diagonal moment (Jones et al. 2024, eqs 248-249).

    mu+ = mu_p + alpha s_p g,  s+ = s_p + alpha s_p^2 d.
    """
    s_p = prior.var
    return diag_belief(prior.mean + alpha * s_p * g, s_p + alpha * s_p**2 * curv.diag(), "BONG (diag moment) variance")


def diag_blr(cur, prior, g, curv, alpha):
    """BLR, diagonal moment (Jones et al. 2024, eqs 252-253).

    mu+ = mu + alpha s v,  s+ = s + alpha s^2 (d - lambda_p + 1/s).
    """
    s = cur.var
    lam_p = 1.0 / prior.var
    v = g + lam_p * (prior.mean - cur.mean)
    return diag_belief(cur.mean + alpha * s * v, s + alpha * s**2 * (curv.diag() - lam_p + 1.0 / s),
                       "BLR (diag moment) variance")


def diag_bog(cur, prior, g, curv, alpha):
    """BOG, diagonal moment (Jones et al. 2024, eqs 256-257).

    mu+ = mu_p + alpha g,  s+ = s_p + (alpha / 2) d.
    """
    return diag_belief(prior.mean + alpha * g, prior.var + 0.5 * alpha * curv.diag(), "BOG (diag moment) variance")


def diag_bbb(cur, prior, g, curv, alpha):
    """BBB, diagonal moment (Jones et al. 2024, eqs 260-261).

    mu+ = mu + alpha v,  s+ = s + (alpha / 2) (d - lambda_p + 1/s).
    """
    s = cur.var
    lam_p = 1.0 / prior.var
    v = g + lam_p * (prior.mean - cur.mean)
    return diag_belief(cur.mean + alpha * v, s + 0.5 * alpha * (curv.diag() - lam_p + 1.0 / s),
                       "BBB (diag moment) variance")


# ============================================================================================
# Diagonal plus low rank (paper App. E.5); needs a factor G = -U U^T


def dlr_bong(cur, prior, g, curv, alpha=1.0):
    """BONG, DLR (Jones et al. 2024, eqs 281-286; LIN-HESS: LO-FI, eqs 287-292).

    W~ = [W_p, sqrt(alpha) U], ups~ = ups_p,
    mu+ = mu_p + alpha (diag(ups~) + W~ W~^T)^{-1} g  (before projection),
    (ups+, W+) = projection of (ups~, W~) to the prior's rank.
    O((R + K)^2 P + (R + K)^3).
    """
    Wtil = np.concatenate([prior.W, np.sqrt(alpha) * curv.factor()], axis=1)
    mean = prior.mean + alpha * linalg.dlr_solve(prior.ups, Wtil, g)
    ups, W = dlr_project(prior.ups, Wtil, prior.rank)
    return dlr_belief(mean, ups, W, "BONG (DLR) precision")


def dlr_blr(cur, prior, g, curv, alpha):
    """BLR, DLR (Jones et al. 2024, eqs 293-301; LIN-HESS: eqs 302-308). Needs 0 < alpha <= 1.

    ups~ = (1 - alpha) ups + alpha ups_p,
    W~ = [sqrt(1 - alpha) W, sqrt(alpha) W_p, sqrt(alpha) U],
    mu+ = mu + alpha (diag(ups~) + W~ W~^T)^{-1} v,  v = g + Lambda_p (mu_p - mu),
    then the rank-R projection. O((2R + K)^2 P) per iteration.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1] for BLR with the DLR family; got {alpha}")
    ups_t = (1.0 - alpha) * cur.ups + alpha * prior.ups
    parts = [np.sqrt(alpha) * prior.W, np.sqrt(alpha) * curv.factor()]
    if alpha < 1.0:
        parts.insert(0, np.sqrt(1.0 - alpha) * cur.W)
    Wtil = np.concatenate(parts, axis=1)
    v = g + dlr_matvec(prior.ups, prior.W, prior.mean - cur.mean)
    mean = cur.mean + alpha * linalg.dlr_solve(ups_t, Wtil, v)
    ups, W = dlr_project(ups_t, Wtil, prior.rank)
    return dlr_belief(mean, ups, W, "BLR (DLR) precision")


def dlr_bog(cur, prior, g, curv, alpha):
    """BOG, DLR (Jones et al. 2024, eqs 309-318): gradient step on (mu, ups, W).

    B = Lambda_p^{-1} U (Woodbury),  mu+ = mu_p + alpha g,
    ups+ = ups_p + (alpha / 2) rowsum(B * B),  W+ = W_p + alpha B (B^T W_p).
    O(R K P + K R^2 + R^3).
    """
    B = linalg.dlr_solve(prior.ups, prior.W, curv.factor())
    ups = prior.ups + 0.5 * alpha * linalg.rowsumsq(B)
    W = prior.W + alpha * (B @ (B.T @ prior.W))
    return dlr_belief(prior.mean + alpha * g, ups, W, "BOG (DLR) precision")


def _dlr_diag_sandwich(ups, W, d):
    """diag(Sigma diag(d) Sigma) for Sigma = (diag(ups) + W W^T)^{-1}, in O(P R^2).

    Sigma = D - B B^T with D = 1/ups, B = D W L^{-T}, L L^T = I + W^T D W, so
    diag = d D^2 - 2 d D rowsum(B^2) + rowsum((B C) * B), C = B^T diag(d) B.
    """
    D = 1.0 / ups
    if W.shape[1] == 0:
        return d * D**2
    L = linalg.cholesky(linalg.dlr_inner(ups, W), "I + W^T diag(1/ups) W")
    B = np.linalg.solve(L, (W * D[:, None]).T).T  # (P, R)
    C = B.T @ (d[:, None] * B)
    return d * D**2 - 2.0 * d * D * linalg.rowsumsq(B) + np.einsum("ij,ij->i", B @ C, B)


def dlr_bbb(cur, prior, g, curv, alpha):
    """BBB, DLR (Jones et al. 2024, eqs 319-321): gradient step on (mu, ups, W) of E[log p] - KL.

    M = Lambda_p - Lambda - G,  mu+ = mu + alpha v,  v = g + Lambda_p (mu_p - mu),
    ups+ = ups + (alpha / 2) diag(Sigma M Sigma),  W+ = W + alpha Sigma M Sigma W,
    with Sigma = Lambda^{-1}. Uses Sigma Lambda Sigma = Sigma:
    Sigma M Sigma = Sigma Lambda_p Sigma - Sigma + (Sigma U)(Sigma U)^T. O((R + K) R P).
    """
    ups, W = cur.ups, cur.W
    U = curv.factor()
    v = g + dlr_matvec(prior.ups, prior.W, prior.mean - cur.mean)
    K, Rp, R = U.shape[1], prior.W.shape[1], W.shape[1]
    S_all = linalg.dlr_solve(ups, W, np.concatenate([U, prior.W, W], axis=1))  # Sigma [U, W_p, W]
    SU, SWp, SW = S_all[:, :K], S_all[:, K:K + Rp], S_all[:, K + Rp:K + Rp + R]
    diag_SMS = (_dlr_diag_sandwich(ups, W, prior.ups) + linalg.rowsumsq(SWp)
                - cur.marginal_variance() + linalg.rowsumsq(SU))
    if R > 0:
        SMSW = linalg.dlr_solve(ups, W, dlr_matvec(prior.ups, prior.W, SW)) - SW + SU @ (SU.T @ W)
        W_new = W + alpha * SMSW
    else:
        W_new = W.copy()
    return dlr_belief(cur.mean + alpha * v, ups + 0.5 * alpha * diag_SMS, W_new, "BBB (DLR) precision")


# ============================================================================================
# lookup table (family, algorithm) -> step

STEPS = {
    ("full-natural", "bong"): full_natural_bong,
    ("full-natural", "blr"): full_natural_blr,
    ("full-natural", "bog"): full_natural_bog,
    ("full-natural", "bbb"): full_natural_bbb,
    ("full", "bong"): full_bong,
    ("full", "blr"): full_blr,
    ("full", "bog"): full_bog,
    ("full", "bbb"): full_bbb,
    ("diag-natural", "bong"): diag_natural_bong,
    ("diag-natural", "blr"): diag_natural_blr,
    ("diag-natural", "bog"): diag_natural_bog,
    ("diag-natural", "bbb"): diag_natural_bbb,
    ("diag", "bong"): diag_bong,
    ("diag", "blr"): diag_blr,
    ("diag", "bog"): diag_bog,
    ("diag", "bbb"): diag_bbb,
    ("dlr", "bong"): dlr_bong,
    ("dlr", "blr"): dlr_blr,
    ("dlr", "bog"): dlr_bog,
    ("dlr", "bbb"): dlr_bbb,
}


def folds_predict(algorithm, estimator):
    """Whether a full-family step of ``algorithm`` with ``estimator`` folds the predict step into its one
    update pass (:func:`full_one_step`): BONG and BOG with a LIN estimator. These are also the
    full-family filters that ``backend="numba"`` takes (its compiled update pass is that pass)."""
    return algorithm in ("bong", "bog") and estimator in ("lin-hess", "lin-ef")


def full_one_step(filt, bel, x, y):
    """(posterior, yhat) of one predict + update of a Bong filter over a full family, or None.

    For algorithm "bong" or "bog" with a LIN estimator the estimate needs only the predicted
    mean, and the inner step touches the predicted covariance only through products and one
    low-rank update, so the predict step is folded into the update (families.PredictedFull):
    one new P x P array per step, and Sigma_p g comes from Sigma_p U (g = U coef). The numbers
    of ``step(predict(bel))`` to round-off.
    None for every other filter (the caller then predicts and updates in turn).
    """
    if (filt._family not in ("full", "full-natural") or not folds_predict(filt.algorithm, filt.estimator)
            or filt.n_iter != 1):
        return None
    prior = PredictedFull(bel, filt.gamma, filt._q_eff, filt._b, compiled=filt.backend == "numba")
    est = filt.estimate(prior, [x], [y])  # LIN: linearised at the predicted mean
    if not (np.all(np.isfinite(est.g)) and np.all(np.isfinite(est.curvature.data))):
        raise DivergenceError("the gradient or curvature estimate is not finite: the filter has diverged",
                              quantity="estimate")
    # as filt.step, with the estimate's coef (g = U coef): Sigma_p g from Sigma_p U
    new = filt._step_fn(prior, prior, est.g, est.curvature, filt.lr, coef=est.coef, **filt._step_kw)
    # the predicted mean of y at the predicted mean: the linearisation's (no second forward pass)
    yhat = est.yhat if est.yhat is not None else filt.likelihood.mean(filt.model.apply(prior.mean, x))
    return new, yhat


def supports(family, estimator):
    """Whether the (family, estimator) pair is defined: DLR needs a low-rank factor, so no MC-HESS."""
    return not (family == "dlr" and estimator == "mc-hess")


def get_step(algorithm, family):
    """The inner-step function for (algorithm, family)."""
    try:
        return STEPS[(family, algorithm)]
    except KeyError:
        raise ValueError(f"no inner step for algorithm={algorithm!r}, family={family!r}") from None
