"""MLP forward pass and Jacobian (one forward pass, C reverse passes) as Numba kernels.

Mirrors ``refbayes.models.MLP.jacobian_manual``. Parameter layout:
for each layer l, W_l (n_{l+1}, n_l) flattened row by row, then b_l (n_{l+1},).
Hidden layers apply the activation, the output layer is linear. Networks without biases
(``rb.Linear(bias=False)``: W_l only, b_l = 0 and not a parameter) are described by
``_offsets(sizes, bias=False)``, which marks the missing biases with b0[l] = -1.

Forward: h_0 = x, a_{l+1} = W_l h_l + b_l, h_{l+1} = act(a_{l+1}); f = a_L.
Reverse pass for output c, delta = e_c, for l = L-1 .. 0:
d f_c / d W_l = delta h_l^T, d f_c / d b_l = delta, then (l > 0)
delta <- (W_l^T delta) * act'(a_l).
"""

import functools

import numba
import numpy as np

from .. import _host

__all__ = ["mlp_value_and_jacobian", "mlp_value_and_jacobian_batch", "mlp_forward", "layer_bias", "ACTIVATION_CODES"]

ACTIVATION_CODES = {"tanh": 0, "relu": 1, "sigmoid": 2, "elu": 3, "linear": 4, "identity": 4}


# kernels/cuda/step.py repeats _act and _dact as CUDA device functions (a CUDA kernel inlines its own copy;
# see the comment there for why they stay two)
@numba.njit(cache=True, error_model="numpy")
def _act(code, a):
    if code == 0:
        return np.tanh(a)
    if code == 1:
        return a if a > 0.0 else 0.0
    if code == 2:
        return 0.5 * (np.tanh(0.5 * a) + 1.0)
    if code == 3:
        return a if a > 0.0 else np.expm1(a)
    return a


@numba.njit(cache=True, error_model="numpy")
def _dact(code, a, h):
    """act'(a) given h = act(a); relu' = 0 at a = 0, elu' = 1 for a > 0 else h + 1."""
    if code == 0:
        return 1.0 - h * h
    if code == 1:
        return 1.0 if a > 0.0 else 0.0
    if code == 2:
        return h * (1.0 - h)
    if code == 3:
        return 1.0 if a > 0.0 else h + 1.0
    return 1.0


@numba.njit(cache=True, error_model="numpy")
def _offsets(sizes, bias=True):
    """Per layer: start of W_l, start of b_l (theta; -1 when the layers have no bias), start of h_l
    in the activation buffer; then P and the buffer length."""
    nl = sizes.shape[0] - 1
    w0 = np.empty(nl, np.int64)
    b0 = np.empty(nl, np.int64)
    hs = np.empty(nl + 1, np.int64)
    pos = 0
    hpos = 0
    for l in range(nl):
        w0[l] = pos
        if bias:
            b0[l] = pos + sizes[l + 1] * sizes[l]
            pos = b0[l] + sizes[l + 1]
        else:
            b0[l] = -1
            pos += sizes[l + 1] * sizes[l]
        hs[l] = hpos
        hpos += sizes[l]
    hs[nl] = hpos
    return w0, b0, hs, pos, hpos + sizes[nl]


@numba.njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _row_dot(w, h):
    """sum_k w[k] h[k], vectorised (the order of the sum is fixed by the compiled code)."""
    s = 0.0
    for k in range(w.shape[0]):
        s += w[k] * h[k]
    return s


@numba.njit(cache=True, error_model="numpy")
def _forward(theta, x, sizes, code, w0, b0, hs, h, dact):
    """Fills h (activations, h_0 = x) and dact (act' of hidden pre-activations, same offsets).
    b0[l] = -1: layer l has no bias."""
    nl = sizes.shape[0] - 1
    for k in range(sizes[0]):
        h[k] = x[k]
    for l in range(nl):
        n_in = sizes[l]
        n_out = sizes[l + 1]
        for r in range(n_out):
            a = theta[b0[l] + r] if b0[l] >= 0 else 0.0
            base = w0[l] + r * n_in
            a = _row_dot(theta[base:base + n_in], h[hs[l]:hs[l] + n_in]) + a
            _set_unit(h, dact, hs[l + 1] + r, a, l == nl - 1, code)


@numba.njit(cache=True, error_model="numpy")
def _set_unit(h, dact, o, a, last, code):
    """h[o] = act(a) and dact[o] = act'(a) for a unit with pre-activation a; the output layer
    (``last``) is linear: h[o] = a, dact[o] = 1. Shared by ``_forward`` and BONG's
    ``bong_mlp._predict_forward``."""
    if last:
        h[o] = a
        dact[o] = 1.0
    else:
        v = _act(code, a)
        h[o] = v
        dact[o] = _dact(code, a, v)


@numba.njit(cache=True, error_model="numpy")
def _reverse_deltas(theta, sizes, w0, hs, dact, os, Dl):
    """Dl[c, os[l] + j] = d f_c / d a_{l+1, j} for every output c and unit j of layer l: the C
    reverse passes over the stored forward pass run together, one BLAS product per layer,
    Delta_{l-1} = (Delta_l W_l) * act'(a_l) from Delta_L = I (os[l]: the first unit of layer l)."""
    nl = sizes.shape[0] - 1
    Cf = sizes[nl]
    delta = np.eye(Cf)
    for l in range(nl - 1, -1, -1):
        n_in = sizes[l]
        n_out = sizes[l + 1]
        for c in range(Cf):
            for r in range(n_out):
                Dl[c, os[l] + r] = delta[c, r]
        if l > 0:
            Wl = theta[w0[l]:w0[l] + n_out * n_in].reshape((n_out, n_in))
            delta = np.dot(delta, Wl)
            for c in range(Cf):
                for k in range(n_in):
                    delta[c, k] *= dact[hs[l] + k]


@numba.njit(cache=True, error_model="numpy")
def _jacobian(theta, sizes, w0, b0, hs, h, dact, os, Dl, J):
    """J (C, P) from the reverse passes: d f_c / d W_l[j, k] = Dl[c, u] h_l[k] and
    d f_c / d b_l[j] = Dl[c, u] for unit u = os[l] + j (Dl (C, units) is overwritten; no bias
    entries where b0[l] = -1)."""
    nl = sizes.shape[0] - 1
    _reverse_deltas(theta, sizes, w0, hs, dact, os, Dl)
    for c in range(sizes[nl]):
        Jc = J[c]
        for l in range(nl):
            n_in = sizes[l]
            hl = h[hs[l]:hs[l] + n_in]
            for r in range(sizes[l + 1]):
                dr = Dl[c, os[l] + r]
                row = Jc[w0[l] + r * n_in:w0[l] + (r + 1) * n_in]
                for k in range(n_in):
                    row[k] = dr * hl[k]
                if b0[l] >= 0:
                    Jc[b0[l] + r] = dr


@numba.njit(cache=True, error_model="numpy")
def value_and_jacobian_batch(theta, X, sizes, code, F, J):
    """F (N, C) outputs and J (N, C, P) Jacobians for the rows of X (N, n_0)."""
    w0, b0, hs, P, nh = _offsets(sizes, True)
    nl = sizes.shape[0] - 1
    h = np.empty(nh)
    dact = np.empty(nh)
    os = np.zeros(nl + 1, np.int64)
    for l in range(nl):
        os[l + 1] = os[l] + sizes[l + 1]
    Dl = np.empty((sizes[nl], os[nl]))
    for m in range(X.shape[0]):
        _forward(theta, X[m], sizes, code, w0, b0, hs, h, dact)
        for r in range(sizes[nl]):
            F[m, r] = h[hs[nl] + r]
        _jacobian(theta, sizes, w0, b0, hs, h, dact, os, Dl, J[m])


@numba.njit(cache=True, error_model="numpy")
def forward_batch(theta, X, sizes, code, F):
    """F (N, C) = network outputs for the rows of X (N, n_0)."""
    w0, b0, hs, P, nh = _offsets(sizes, True)
    nl = sizes.shape[0] - 1
    h = np.empty(nh)
    dact = np.empty(nh)
    for m in range(X.shape[0]):
        _forward(theta, X[m], sizes, code, w0, b0, hs, h, dact)
        for r in range(sizes[nl]):
            F[m, r] = h[hs[nl] + r]


@functools.lru_cache(maxsize=64)
def _layout_sizes(key):
    """(P with biases, P without) of the int64 layer sizes whose bytes are ``key`` (cached: every fused
    step asks, a few microseconds of NumPy each time)."""
    sizes = np.frombuffer(key, dtype=np.int64)
    return int(np.sum(sizes[1:] * (sizes[:-1] + 1))), int(np.sum(sizes[1:] * sizes[:-1]))


def layer_bias(sizes, n_params, bias=None):
    """Whether a network with layer ``sizes`` and ``n_params`` parameters has biases: P =
    sum_l n_{l+1} (n_l + 1) with them, sum_l n_{l+1} n_l without (never equal). ``bias`` (True or
    False) is checked against P; None infers it. Raises ValueError when P fits neither layout."""
    sizes = np.asarray(sizes, dtype=np.int64)
    with_b, without = _layout_sizes(sizes.tobytes())
    if bias is None:
        if n_params not in (with_b, without):
            raise ValueError(f"mean has {n_params} parameters; layer sizes {list(sizes)} need {with_b} "
                             f"(with biases) or {without} (without)")
        return n_params == with_b
    need = with_b if bias else without
    if n_params != need:
        raise ValueError(f"mean has {n_params} parameters; layer sizes {list(sizes)} with bias={bool(bias)} "
                         f"need {need}")
    return bool(bias)


def _spec(model):
    try:
        sizes = np.asarray(tuple(model.layer_sizes), dtype=np.int64)
        act = model.activation
    except (AttributeError, TypeError) as exc:
        raise TypeError(f"model must be an MLP (with layer_sizes and activation); got {type(model).__name__}") from exc
    if sizes.ndim != 1 or sizes.shape[0] < 2 or np.any(sizes < 1):
        raise ValueError(f"model.layer_sizes must be >= 2 positive integers; got {list(sizes)}")
    if not isinstance(act, str) or act.lower() not in ACTIVATION_CODES:
        raise ValueError(f"model.activation must be one of {tuple(ACTIVATION_CODES)}; got {act!r}")
    P = int(np.sum(sizes[1:] * (sizes[:-1] + 1)))
    return sizes, ACTIVATION_CODES[act.lower()], P


def _inputs(model, theta, X, name):
    sizes, code, P = _spec(model)
    theta = _host.check_finite(_host.as_f64(theta, "theta", (P,)), "theta")
    X = _host.check_finite(_host.as_f64(X, name, (None, int(sizes[0]))), name)
    return sizes, code, P, theta, X


def mlp_value_and_jacobian(model, theta, x):
    """(f (C,), J (C, P)) for one input x (n_0,), as ``MLP.jacobian_manual``.

    model: anything with ``layer_sizes`` and ``activation`` (a refbayes MLP).
    """
    sizes = _spec(model)[0]
    x = np.asarray(x)
    if x.ndim == 0 and sizes[0] == 1:
        x = x.reshape(1)
    x = _host.as_f64(x, "x", (int(sizes[0]),))
    sizes, code, P, theta, X = _inputs(model, theta, x[None, :], "x")
    C = int(sizes[-1])
    F = np.empty((1, C))
    J = np.empty((1, C, P))
    value_and_jacobian_batch(theta, X, sizes, code, F, J)
    return F[0], J[0]


def mlp_value_and_jacobian_batch(model, theta, X):
    """(F (N, C), J (N, C, P)) for the rows of X (N, n_0)."""
    sizes, code, P, theta, X = _inputs(model, theta, X, "X")
    C = int(sizes[-1])
    F = np.empty((X.shape[0], C))
    J = np.empty((X.shape[0], C, P))
    value_and_jacobian_batch(theta, X, sizes, code, F, J)
    return F, J


def mlp_forward(model, theta, X):
    """Network outputs F (N, C) for the rows of X (N, n_0), as ``MLP.apply_batch``."""
    sizes, code, P, theta, X = _inputs(model, theta, X, "X")
    F = np.empty((X.shape[0], int(sizes[-1])))
    forward_batch(theta, X, sizes, code, F)
    return F
