"""Models: maps from a flat parameter vector ``theta`` (P,) and one input ``x`` to an output (C,).

A filter sees a model only through four things: ``n_params`` (P), ``apply(theta, x)`` -> (C,),
``jacobian(theta, x)`` -> (C, P) and ``init_params(rng)`` -> (P,). The output is whatever the
likelihood expects (a mean, logits, a log rate); the model has no link function of its own.

Three models are provided:

``Linear(in_dim, out_dim, bias=True)``
    f(theta, x) = W x + b, with a closed-form Jacobian.
``MLP(layer_sizes, activation="tanh")``
    a fully connected network; hidden layers use ``activation``, the last layer is linear.
    Besides the autograd Jacobian it has a hand-written one (one forward pass, then one
    reverse pass per output) that the Numba kernels mirror loop for loop.
``Function(fn, n_params, out_dim, in_dim=None, init=None)``
    any function ``fn(theta, x)`` written with ``autograd.numpy``.

Parameter layout (fixed; the kernels rely on it). For each layer l = 0, ..., L-1 in order,
with n_l inputs and n_{l+1} outputs::

    theta = [ vec(W_0), b_0, vec(W_1), b_1, ..., vec(W_{L-1}), b_{L-1} ]

where vec(W_l) is W_l of shape (n_{l+1}, n_l) flattened in C order (row by row), and b_l has
shape (n_{l+1},). ``Linear`` is the one-layer case (without b when ``bias=False``).

All public methods validate their inputs and raise ``ValueError`` (wrong shape, NaN or inf,
naming the argument, the shape expected and the shape received) or ``TypeError`` (non-numeric
input). Arrays are returned as float64. Inputs that are autograd boxes (a model called inside
a function that autograd is differentiating) are shape-checked and passed through untouched, so
models compose with ``autograd.grad`` / ``autograd.hessian``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import autograd
import autograd.numpy as anp
import numpy as np
from autograd.tracer import Box
from numpy.typing import ArrayLike, NDArray

from ._validate import positive_int

__all__ = [
    "ACTIVATIONS",
    "Model",
    "Linear",
    "MLP",
    "Function",
    "activation",
    "activation_derivative",
]

#: Activation names accepted by :class:`MLP` ("identity" is an alias of "linear").
ACTIVATIONS = ("tanh", "relu", "sigmoid", "elu", "linear")
_ALIASES = {"identity": "linear"}


# ---------------------------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------------------------


def _canonical_activation(name):
    if not isinstance(name, str):
        raise TypeError(f"activation must be a string, one of {ACTIVATIONS}; got {type(name).__name__}")
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS} (or 'identity'); got {name!r}")
    return key


def activation(name: str, a: ArrayLike) -> NDArray[np.float64]:
    """Apply activation ``name`` elementwise to pre-activations ``a`` (any shape).

    Written with ``autograd.numpy`` so it can be differentiated:

    - tanh(a);
    - relu(a) = max(a, 0), with derivative 0 at a = 0 (``where(a > 0, a, 0)``);
    - sigmoid(a) = 1 / (1 + exp(-a)), computed as (1 + tanh(a/2)) / 2 (no overflow);
    - elu(a) = a for a > 0, exp(a) - 1 otherwise (alpha = 1; derivative 1 at a = 0);
    - linear(a) = a.
    """
    name = _canonical_activation(name)
    if name == "tanh":
        return anp.tanh(a)
    if name == "relu":
        return anp.where(a > 0, a, 0.0)
    if name == "sigmoid":
        return 0.5 * (anp.tanh(0.5 * a) + 1.0)
    if name == "elu":
        # expm1 only sees the non-positive branch, so neither it nor its gradient overflows
        return anp.where(a > 0, a, anp.expm1(anp.where(a > 0, 0.0, a)))
    return a


def activation_derivative(name: str, a: ArrayLike, h: ArrayLike) -> NDArray[np.float64]:
    """Derivative of activation ``name`` at pre-activation ``a``, given ``h = activation(a)``.

    a, h: arrays of the same shape; returns that shape. Uses ``h`` where it is cheaper:
    tanh' = 1 - h^2, sigmoid' = h (1 - h), relu' = 1[a > 0] (0 at a = 0),
    elu' = 1 for a > 0 and h + 1 = exp(a) otherwise, linear' = 1.
    """
    name = _canonical_activation(name)
    if name == "tanh":
        return 1.0 - h * h
    if name == "relu":
        return np.where(a > 0, 1.0, 0.0)
    if name == "sigmoid":
        return h * (1.0 - h)
    if name == "elu":
        return np.where(a > 0, 1.0, h + 1.0)
    return np.ones_like(a)


# ---------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------


def _shape_str(shape):
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _as_float_array(value, name):
    """np.asarray(value) as float64, with TypeError for non-numeric and ValueError for NaN/inf."""
    if type(value) is np.ndarray and value.dtype == np.float64:  # the common case, checked faster
        if not np.isfinite(value).all():
            raise ValueError(f"{name} contains NaN or inf")
        return value
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be a numeric array; could not convert {type(value).__name__}: {exc}") from None
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be a real numeric array; got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _check_array(value, name, shape):
    """Validate ``value`` against ``shape`` (None entries match any size); return float64 array.

    Autograd boxes are shape-checked only and returned as they are.
    """
    if isinstance(value, Box):
        got = anp.shape(value)
        arr = value
    else:
        arr = _as_float_array(value, name)
        got = arr.shape
    ok = len(got) == len(shape) and all(s is None or s == g for s, g in zip(shape, got))
    if not ok:
        raise ValueError(f"{name} must have shape {_shape_str(shape)}; got {_shape_str(got)}")
    return arr


# ---------------------------------------------------------------------------------------------
# base class
# ---------------------------------------------------------------------------------------------


class Model:
    """Base class: a map f(theta, x) from parameters theta (P,) and an input x (in_dim,) to (out_dim,).

    Subclasses implement ``_forward(theta, x)`` with ``autograd.numpy`` (inputs already
    validated) and ``init_params``. The base class supplies validation, ``apply``,
    ``apply_batch`` (a loop), and ``jacobian`` by ``autograd.jacobian``.

    Attributes
    ----------
    n_params : int
        P, the length of theta.
    in_dim : int or None
        length of one input x (None: any shape, see :class:`Function`).
    out_dim : int
        C, the length of f(theta, x).

    Models hold configuration only and are immutable after construction.
    """

    #: jacobian methods this class accepts; the first is the default
    _jacobian_methods = ("autograd",)

    def __init__(self, n_params: int, in_dim: int | None, out_dim: int) -> None:
        object.__setattr__(self, "n_params", positive_int(n_params, "n_params"))
        object.__setattr__(self, "in_dim", None if in_dim is None else positive_int(in_dim, "in_dim"))
        object.__setattr__(self, "out_dim", positive_int(out_dim, "out_dim"))

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable; cannot delete {name!r}")

    # -- validation -------------------------------------------------------------------------

    def validate_theta(self, theta: ArrayLike) -> NDArray[np.float64]:
        """Return theta as a float64 array of shape (P,); ValueError/TypeError otherwise."""
        return _check_array(theta, "theta", (self.n_params,))

    def validate_x(self, x: ArrayLike) -> NDArray[np.float64]:
        """Return x as a float64 array of shape (in_dim,); ValueError/TypeError otherwise.

        A scalar is accepted when in_dim == 1. When in_dim is None any shape is accepted.
        """
        if type(x) is np.ndarray and x.dtype == np.float64 and x.shape == (self.in_dim,):  # the common case
            return _as_float_array(x, "x")
        if self.in_dim is None:
            if isinstance(x, Box):
                return x
            return _as_float_array(x, "x")
        if self.in_dim == 1 and not isinstance(x, Box) and np.ndim(x) == 0:
            return _check_array(np.reshape(_as_float_array(x, "x"), (1,)), "x", (1,))
        return _check_array(x, "x", (self.in_dim,))

    def validate_X(self, X: ArrayLike) -> NDArray[np.float64]:
        """Return a batch of inputs X as float64 (N, in_dim) (or (N, ...) when in_dim is None)."""
        if self.in_dim is None:
            arr = X if isinstance(X, Box) else _as_float_array(X, "X")
            if anp.ndim(arr) < 1:
                raise ValueError(f"X must have a leading batch axis, got shape {_shape_str(anp.shape(arr))}")
            return arr
        return _check_array(X, "X", (None, self.in_dim))

    def _resolve_method(self, method):
        if method is None:
            return self._jacobian_methods[0]
        if method not in self._jacobian_methods:
            raise ValueError(
                f"method must be one of {self._jacobian_methods} for {type(self).__name__}; got {method!r}"
            )
        return method

    # -- evaluation -------------------------------------------------------------------------

    def _forward(self, theta, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def init_params(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """Draw initial parameters theta (P,) using the Generator ``rng``."""
        raise NotImplementedError

    def apply(self, theta: ArrayLike, x: ArrayLike) -> NDArray[np.float64]:
        """f(theta, x). theta: (P,), x: (in_dim,). Returns (out_dim,)."""
        return self._forward(self.validate_theta(theta), self.validate_x(x))

    def apply_batch(self, theta: ArrayLike, X: ArrayLike) -> NDArray[np.float64]:
        """f(theta, x_n) for every row. theta: (P,), X: (N, in_dim). Returns (N, out_dim)."""
        theta = self.validate_theta(theta)
        X = self.validate_X(X)
        n = anp.shape(X)[0]
        if n == 0:
            return np.zeros((0, self.out_dim))
        return anp.stack([self._forward(theta, X[i]) for i in range(n)])

    def _jacobian_autograd(self, theta, x):
        return autograd.jacobian(lambda th: self._forward(th, x))(theta)

    def jacobian(self, theta: ArrayLike, x: ArrayLike, method: str | None = None) -> NDArray[np.float64]:
        """d f(theta, x) / d theta. theta: (P,), x: (in_dim,). Returns (out_dim, P).

        method: "autograd" (the only one in the base class).
        """
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        self._resolve_method(method)
        return self._jacobian_autograd(theta, x)

    def value_and_jacobian(self, theta: ArrayLike, x: ArrayLike,
                           method: str | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(f(theta, x), jacobian) with shapes ((out_dim,), (out_dim, P))."""
        return self.apply(theta, x), self.jacobian(theta, x, method=method)


def _lecun_normal(rng, n_out, n_in):
    """W (n_out, n_in) with entries N(0, 1/n_in) (LeCun normal)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)


# ---------------------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------------------


class Linear(Model):
    """Affine model f(theta, x) = W x + b.

    theta layout: vec(W) with W of shape (out_dim, in_dim) flattened in C order, then b (out_dim,)
    if ``bias`` (P = out_dim * in_dim + out_dim), else vec(W) only (P = out_dim * in_dim).

    The Jacobian is exact: d f_c / d W_{c', i} = [c = c'] x_i and d f_c / d b_{c'} = [c = c'],
    i.e. J = [ I_C kron x^T, I_C ]  (C, P). ``method="autograd"`` differentiates instead.
    """

    _jacobian_methods = ("exact", "autograd")

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        in_dim = positive_int(in_dim, "in_dim")
        out_dim = positive_int(out_dim, "out_dim")
        if not isinstance(bias, (bool, np.bool_)):
            raise TypeError(f"bias must be True or False; got {bias!r}")
        super().__init__(out_dim * in_dim + (out_dim if bias else 0), in_dim, out_dim)
        object.__setattr__(self, "bias", bool(bias))

    def __repr__(self):
        return f"Linear(in_dim={self.in_dim}, out_dim={self.out_dim}, bias={self.bias}, n_params={self.n_params})"

    def unflatten(self, theta: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """theta (P,) -> (W (out_dim, in_dim), b (out_dim,)); b is zeros when bias=False."""
        theta = self.validate_theta(theta)
        return self._split(theta)

    def _split(self, theta):
        nw = self.out_dim * self.in_dim
        W = anp.reshape(theta[:nw], (self.out_dim, self.in_dim))
        b = theta[nw:] if self.bias else anp.zeros(self.out_dim)
        return W, b

    def flatten(self, W: ArrayLike, b: ArrayLike | None = None) -> NDArray[np.float64]:
        """(W (out_dim, in_dim), b (out_dim,)) -> theta (P,). b is required iff bias=True."""
        W = _check_array(W, "W", (self.out_dim, self.in_dim))
        if self.bias:
            if b is None:
                raise ValueError("b is required for Linear(bias=True)")
            b = _check_array(b, "b", (self.out_dim,))
            return np.concatenate([np.ravel(W), b])
        if b is not None:
            raise ValueError("b must be None for Linear(bias=False)")
        return np.ravel(W).copy()

    def init_params(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """LeCun normal W (entries N(0, 1/in_dim)), zero b. Returns (P,)."""
        W = _lecun_normal(rng, self.out_dim, self.in_dim)
        if self.bias:
            return np.concatenate([W.ravel(), np.zeros(self.out_dim)])
        return W.ravel()

    def _forward(self, theta, x):
        W, b = self._split(theta)
        return anp.dot(W, x) + b

    def apply_batch(self, theta: ArrayLike, X: ArrayLike) -> NDArray[np.float64]:
        """W x_n + b for every row. theta: (P,), X: (N, in_dim). Returns (N, out_dim)."""
        theta = self.validate_theta(theta)
        X = self.validate_X(X)
        W, b = self._split(theta)
        return anp.dot(X, W.T) + b

    def jacobian(self, theta: ArrayLike, x: ArrayLike, method: str | None = None) -> NDArray[np.float64]:
        """d (W x + b) / d theta = [I kron x^T, I]. theta: (P,), x: (in_dim,). Returns (out_dim, P).

        method: "exact" (default, closed form) or "autograd".
        """
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        method = self._resolve_method(method)
        if method == "autograd" or isinstance(theta, Box) or isinstance(x, Box):
            return self._jacobian_autograd(theta, x)
        eye = np.eye(self.out_dim)
        J_W = np.kron(eye, x[None, :])
        return np.concatenate([J_W, eye], axis=1) if self.bias else J_W


# ---------------------------------------------------------------------------------------------
# MLP
# ---------------------------------------------------------------------------------------------


class MLP(Model):
    """Fully connected network. layer_sizes = [n_0, n_1, ..., n_L]: input n_0, output n_L.

    h_0 = x;  a_{l+1} = W_l h_l + b_l;  h_{l+1} = act(a_{l+1}) for l < L-1;  f = a_L (linear output).

    theta layout: for l = 0..L-1, vec(W_l) (W_l of shape (n_{l+1}, n_l), C order) then
    b_l (n_{l+1},). P = sum_l n_{l+1} (n_l + 1).

    Attributes
    ----------
    layer_sizes : tuple of int
    activation : str  (canonical name, one of ACTIVATIONS)
    n_layers : int  (L, the number of weight matrices)
    layer_offsets : (L, 3) int64 read-only array; row l = [start of W_l, start of b_l, end of b_l]
        in theta, so W_l = theta[o[l,0]:o[l,1]].reshape(n_{l+1}, n_l), b_l = theta[o[l,1]:o[l,2]].

    ``jacobian`` uses the hand-written reverse pass (``method="manual"``, the default) or
    autograd (``method="autograd"``); both give the same numbers to round-off. The ReLU derivative
    at exactly 0 is taken as 0 in both.
    """

    _jacobian_methods = ("manual", "autograd")

    def __init__(self, layer_sizes: Sequence[int], activation: str = "tanh") -> None:
        try:
            sizes = tuple(layer_sizes)
        except TypeError:
            raise TypeError(f"layer_sizes must be a sequence of positive integers; got {layer_sizes!r}") from None
        if len(sizes) < 2:
            raise ValueError(f"layer_sizes needs at least 2 entries (input and output sizes); got {list(sizes)}")
        sizes = tuple(positive_int(n, f"layer_sizes[{i}]") for i, n in enumerate(sizes))
        act = _canonical_activation(activation)
        offsets = np.zeros((len(sizes) - 1, 3), dtype=np.int64)
        pos = 0
        for l in range(len(sizes) - 1):
            n_in, n_out = sizes[l], sizes[l + 1]
            offsets[l] = (pos, pos + n_out * n_in, pos + n_out * n_in + n_out)
            pos = int(offsets[l, 2])
        offsets.setflags(write=False)
        super().__init__(pos, sizes[0], sizes[-1])
        object.__setattr__(self, "layer_sizes", sizes)
        object.__setattr__(self, "activation", act)
        object.__setattr__(self, "n_layers", len(sizes) - 1)
        object.__setattr__(self, "layer_offsets", offsets)

    def __repr__(self):
        return (
            f"MLP(layer_sizes={list(self.layer_sizes)}, activation={self.activation!r}, "
            f"n_params={self.n_params})"
        )

    # -- layout -----------------------------------------------------------------------------

    def _layers(self, theta):
        out = []
        for l in range(self.n_layers):
            w0, b0, b1 = (int(v) for v in self.layer_offsets[l])
            W = anp.reshape(theta[w0:b0], (self.layer_sizes[l + 1], self.layer_sizes[l]))
            out.append((W, theta[b0:b1]))
        return out

    def unflatten(self, theta: ArrayLike) -> list[tuple[NDArray[np.float64], NDArray[np.float64]]]:
        """theta (P,) -> [(W_0, b_0), ..., (W_{L-1}, b_{L-1})], W_l (n_{l+1}, n_l), b_l (n_{l+1},).

        The arrays are copies; changing them does not change theta.
        """
        theta = self.validate_theta(theta)
        if isinstance(theta, Box):
            return self._layers(theta)
        return [(W.copy(), b.copy()) for W, b in self._layers(theta)]

    def flatten(self, layers: Sequence[tuple[ArrayLike, ArrayLike]]) -> NDArray[np.float64]:
        """[(W_0, b_0), ...] with the shapes of ``unflatten`` -> theta (P,)."""
        layers = list(layers)
        if len(layers) != self.n_layers:
            raise ValueError(f"layers must have {self.n_layers} (W, b) pairs, got {len(layers)}")
        parts = []
        for l, pair in enumerate(layers):
            try:
                W, b = pair
            except (TypeError, ValueError):
                raise ValueError(f"layers[{l}] must be a (W, b) pair") from None
            n_in, n_out = self.layer_sizes[l], self.layer_sizes[l + 1]
            parts.append(np.ravel(_check_array(W, f"W_{l}", (n_out, n_in))))
            parts.append(_check_array(b, f"b_{l}", (n_out,)))
        return np.concatenate(parts)

    def init_params(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """LeCun normal weights (W_l entries N(0, 1/n_l)), zero biases. Returns (P,)."""
        parts = []
        for l in range(self.n_layers):
            n_in, n_out = self.layer_sizes[l], self.layer_sizes[l + 1]
            parts.append(_lecun_normal(rng, n_out, n_in).ravel())
            parts.append(np.zeros(n_out))
        return np.concatenate(parts)

    # -- forward ----------------------------------------------------------------------------

    def _forward(self, theta, x):
        h = x
        layers = self._layers(theta)
        for l, (W, b) in enumerate(layers):
            a = anp.dot(W, h) + b
            h = a if l == self.n_layers - 1 else activation(self.activation, a)
        return h

    def apply_batch(self, theta: ArrayLike, X: ArrayLike) -> NDArray[np.float64]:
        """Network output for every row. theta: (P,), X: (N, n_0). Returns (N, n_L)."""
        theta = self.validate_theta(theta)
        H = self.validate_X(X)
        for l, (W, b) in enumerate(self._layers(theta)):
            A = anp.dot(H, W.T) + b
            H = A if l == self.n_layers - 1 else activation(self.activation, A)
        return H

    # -- Jacobian ---------------------------------------------------------------------------

    def jacobian_manual(self, theta: ArrayLike, x: ArrayLike) -> NDArray[np.float64]:
        """Output and Jacobian by one forward pass and C = n_L reverse passes, in plain NumPy.

        theta: (P,), x: (n_0,). Returns (f (C,), J (C, P)).

        Forward: h_0 = x, a_{l+1} = W_l h_l + b_l, h_{l+1} = act(a_{l+1}) (h_L = a_L); all a and h
        are stored. Reverse pass for output c, starting from delta = e_c (the gradient of f_c
        with respect to a_L), for l = L-1 down to 0:

            d f_c / d W_l = delta h_l^T      (n_{l+1}, n_l), written at the W_l slot of row c
            d f_c / d b_l = delta            (n_{l+1},),     written at the b_l slot of row c
            delta <- (W_l^T delta) * act'(a_l)       (only if l > 0; gradient wrt a_l)
        """
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        if isinstance(theta, Box) or isinstance(x, Box):
            raise TypeError("jacobian_manual works on plain arrays; use method='autograd' under autograd")
        L = self.n_layers
        layers = self._layers(theta)

        # forward pass; hs[l] is the input of layer l, pre[l] the pre-activation of layer l's output
        hs = [x]
        pre = []
        for l in range(L):
            W, b = layers[l]
            a = W @ hs[l] + b
            pre.append(a)
            hs.append(a if l == L - 1 else activation(self.activation, a))
        f = hs[L]

        # act'(a) for every hidden layer's pre-activation (the output layer is linear)
        dact = [activation_derivative(self.activation, pre[l], hs[l + 1]) for l in range(L - 1)]

        J = np.zeros((self.out_dim, self.n_params))
        for c in range(self.out_dim):
            delta = np.zeros(self.layer_sizes[L])
            delta[c] = 1.0
            for l in range(L - 1, -1, -1):
                W, _ = layers[l]
                w0, b0, b1 = (int(v) for v in self.layer_offsets[l])
                J[c, w0:b0] = np.outer(delta, hs[l]).ravel()
                J[c, b0:b1] = delta
                if l > 0:
                    delta = (W.T @ delta) * dact[l - 1]
        return f, J

    def jacobian(self, theta: ArrayLike, x: ArrayLike, method: str | None = None) -> NDArray[np.float64]:
        """d f(theta, x) / d theta. theta: (P,), x: (n_0,). Returns (n_L, P).

        method: "manual" (default; see ``jacobian_manual``) or "autograd". Autograd boxes
        always take the autograd path.
        """
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        method = self._resolve_method(method)
        if method == "autograd" or isinstance(theta, Box) or isinstance(x, Box):
            return self._jacobian_autograd(theta, x)
        return self.jacobian_manual(theta, x)[1]

    def value_and_jacobian(self, theta: ArrayLike, x: ArrayLike,
                           method: str | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(f(theta, x), jacobian) with shapes ((n_L,), (n_L, P)); one forward pass for "manual"."""
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        method = self._resolve_method(method)
        if method == "manual" and not (isinstance(theta, Box) or isinstance(x, Box)):
            return self.jacobian_manual(theta, x)
        return self._forward(theta, x), self._jacobian_autograd(theta, x)


# ---------------------------------------------------------------------------------------------
# Function
# ---------------------------------------------------------------------------------------------


class Function(Model):
    """Wrap any function fn(theta (P,), x) -> (out_dim,) written with ``autograd.numpy``.

    A scalar (or any array with out_dim entries) returned by fn is reshaped to (out_dim,); any
    other size raises ValueError. in_dim: the length of x, checked on every call; None accepts
    inputs of any shape (still checked for NaN/inf), with batches stacked along axis 0.

    init: optional callable init(rng) -> (P,). Without it ``init_params`` draws theta ~ N(0, I_P),
    i.e. a draw from the unit-variance prior that filters use by default; pass ``init`` for a
    network-style scaled initialisation.

    The Jacobian is ``autograd.jacobian`` of fn with respect to theta.
    """

    def __init__(self, fn: Callable[[Any, Any], Any], n_params: int, out_dim: int, in_dim: int | None = None,
                 init: Callable[[np.random.Generator], ArrayLike] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable; got {type(fn).__name__}")
        if init is not None and not callable(init):
            raise TypeError(f"init must be callable or None; got {type(init).__name__}")
        super().__init__(n_params, in_dim, out_dim)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "init", init)

    def __repr__(self):
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return (
            f"Function(fn={name}, n_params={self.n_params}, out_dim={self.out_dim}, "
            f"in_dim={self.in_dim}, init={'default N(0, I)' if self.init is None else getattr(self.init, '__name__', 'custom')})"
        )

    def _forward(self, theta, x):
        out = self.fn(theta, x)
        size = int(np.prod(anp.shape(out)))
        if size != self.out_dim:
            raise ValueError(
                f"fn(theta, x) must return {self.out_dim} values (out_dim), got shape {_shape_str(anp.shape(out))}"
            )
        out = anp.reshape(out, (self.out_dim,))
        if not isinstance(out, Box):
            out = np.asarray(out, dtype=np.float64)
        return out

    def init_params(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """init(rng) if given, else N(0, I_P). Returns (P,), validated."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
        if self.init is None:
            return rng.standard_normal(self.n_params)
        return _check_array(self.init(rng), "init(rng)", (self.n_params,))

    def jacobian(self, theta: ArrayLike, x: ArrayLike, method: str | None = None) -> NDArray[np.float64]:
        """d fn(theta, x) / d theta by autograd. theta: (P,), x: (in_dim,). Returns (out_dim, P)."""
        theta = self.validate_theta(theta)
        x = self.validate_x(x)
        self._resolve_method(method)
        J = self._jacobian_autograd(theta, x)
        return J if isinstance(J, Box) else np.asarray(J, dtype=np.float64)
