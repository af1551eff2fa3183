"""One numbering of the compiled steps' status codes and the errors they stand for.

A compiled step cannot raise a Python exception with a useful message, so it writes a status
code into ``info[0]`` and returns; its host wrapper turns the code into the error. Every kernel
takes its codes from here, so that a code means the same failure in every kernel (the fused
LO-FI step ``step``, the diagonal EKF steps ``mlp_diag``, BONG's steps ``bong_mlp``, and the GPU
step, which shares the LO-FI host algebra), and :func:`raise_status` gives the shared messages.

Codes (module constants, compile-time constants in the kernels):

=============  ====================================================================================
OK             the step succeeded
FALLBACK       the one-Gram route failed its accuracy guard: the caller takes the general route
NOT_PD_R       the observation covariance R is not positive (semi-)definite
NOT_PD_CORE    I + W~^T diag(1/ups) W~ is not positive definite (LO-FI update)
NOT_PD_PRED    I + q W^T diag(D) W is not positive definite (DLR predict)
NOT_PD_S       the innovation covariance S = H V H^T + R is finite but not positive definite (diagonal
               EKFs: a saturated likelihood, whose R and Jacobian vanish together; a non-finite S is BAD)
BAD            a non-finite number in the step (a bad input is named first, else an overflow)
BAD_VAR        a variance or precision became <= 0 (the wrapper reports it with its index)
BAD_MODEL      the model output or the likelihood's moments at the mean are not finite
BAD_ESTIMATE   the gradient or curvature estimate is not finite
BAD_OUT        an update produced NaN or inf (the wrapper reports it with its inner iteration)
=============  ====================================================================================
"""

from .. import _host

__all__ = ["OK", "FALLBACK", "NOT_PD_R", "NOT_PD_CORE", "NOT_PD_PRED", "NOT_PD_S", "BAD", "BAD_VAR", "BAD_MODEL",
           "BAD_ESTIMATE", "BAD_OUT", "raise_status"]

OK, FALLBACK, NOT_PD_R, NOT_PD_CORE, NOT_PD_PRED, NOT_PD_S, BAD, BAD_VAR, BAD_MODEL, BAD_ESTIMATE, BAD_OUT = range(11)


def raise_status(status, what, R=None, **inputs):
    """Raise the error that ``status`` stands for in the step named ``what`` (e.g. "LO-FI step").

    Returns True for FALLBACK (the caller takes the general route) and False for OK. ``inputs``
    name the arrays that ``_host.raise_nonfinite`` checks for a bad input before it reports an
    overflow (BAD). BAD_VAR and BAD_OUT carry kernel-specific detail (an index, an inner
    iteration): their wrappers report them before calling this; here they only get a generic message.
    R: for NOT_PD_R, the observation covariance that failed, where the wrapper can rebuild it: the
    error is then the reference's (``errors.r_not_positive_definite``: it names a zero variance and
    its remedies); without it, a generic message.
    """
    if status == OK:  # every step's case first, before the import below
        return False
    if status == FALLBACK:
        return True
    from refbayes.errors import DivergenceError, NotPositiveDefiniteError, r_not_positive_definite

    if status == NOT_PD_R:
        if R is not None:
            raise r_not_positive_definite(R)
        raise NotPositiveDefiniteError("the observation covariance R is not positive (semi-)definite")
    if status == NOT_PD_CORE:
        raise NotPositiveDefiniteError("I + W~^T diag(1/ups) W~ is not positive definite")
    if status == NOT_PD_PRED:
        raise NotPositiveDefiniteError("I + q W^T diag(D) W is not positive definite")
    if status == NOT_PD_S:  # finite: R only semi-definite where H V H^T leaves a direction out
        raise NotPositiveDefiniteError(f"{what}: innovation covariance S = H V H^T + R is not positive definite "
                                       "(R is singular where the model's Jacobian vanishes, e.g. a saturated "
                                       "probability)")
    if status == BAD:
        _host.raise_nonfinite(what, **inputs)
    if status == BAD_MODEL:
        raise DivergenceError("the model output or the likelihood's moments at the current mean are not finite: "
                              "the filter has diverged", quantity="model output")
    if status == BAD_ESTIMATE:
        raise DivergenceError("the gradient or curvature estimate is not finite: the filter has diverged",
                              quantity="estimate")
    if status == BAD_VAR:
        raise NotPositiveDefiniteError(f"{what}: a variance or precision became non-positive")
    if status == BAD_OUT:
        raise DivergenceError(f"{what} produced NaN or inf (overflow)", quantity=what)
    raise RuntimeError(f"{what}: unknown kernel status {status}")
