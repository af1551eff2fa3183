"""LAPACK routines that numba's ``np.linalg`` does not offer, callable from compiled kernels.

``np.linalg.svd`` in numba always computes both singular-vector sets (``gesdd``). The LO-FI
steps only need the right singular vectors of a small square R factor, which ``dgesvd``
computes alone in about two thirds of the time. The routine comes from SciPy's LAPACK
(``scipy.linalg.cython_lapack``, the library numba's own linear algebra calls) and is bound by
symbol name, so that the kernels that call it can be cached to disk.
"""

import numba
import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic

__all__ = ["right_singular_vectors"]

_SYMBOL = "refbayes_cython_lapack_dgesvd"
llb.add_symbol(_SYMBOL, get_cython_function_address("scipy.linalg.cython_lapack", "dgesvd"))


@intrinsic
def _dgesvd(typingctx, jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, info):
    """dgesvd(JOBU, JOBVT, M, N, A, LDA, S, U, LDU, VT, LDVT, WORK, LWORK, INFO), every argument
    passed as a 1-element or larger array (Fortran passes by reference)."""
    args = (jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, info)
    if not all(isinstance(t, types.Array) for t in args):
        return None
    sig = types.void(*args)

    def codegen(context, builder, signature, values):
        ptrs = []
        for ty, val in zip(signature.args, values):
            data = context.make_array(ty)(context, builder, val).data
            ptrs.append(builder.bitcast(data, cgutils.voidptr_t))
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t] * len(ptrs))
        fn = cgutils.get_or_insert_function(builder.module, fnty, _SYMBOL)
        builder.call(fn, ptrs)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True)
def right_singular_vectors(R):
    """Vt (n, n): the right singular vectors of the square R (n, n) as rows, in the order of
    decreasing singular values (as ``np.linalg.svd(R)[2]``), or an empty (0, n) array when LAPACK
    does not converge. R is not changed.

    R's C-order buffer is R^T in Fortran order, and the left singular vectors of R^T are the
    right singular vectors of R: LAPACK writes them as the columns of a Fortran-order U, which
    read in C order is Vt.
    """
    n = R.shape[0]
    A = np.ascontiguousarray(R).copy()
    if n == 0:
        return np.zeros((0, 0))
    jobu = np.array([ord("A")], np.int8)
    jobvt = np.array([ord("N")], np.int8)
    nn = np.array([n], np.int32)
    one = np.ones(1, np.int32)
    lw = 8 * n + 64
    lwork = np.array([lw], np.int32)
    info = np.zeros(1, np.int32)
    s = np.empty(n)
    U = np.empty((n, n))
    vt = np.empty(1)
    work = np.empty(lw)
    _dgesvd(jobu, jobvt, nn, nn, A, nn, s, U, nn, vt, one, work, lwork, info)
    if info[0] != 0:
        return np.zeros((0, n))
    return U
