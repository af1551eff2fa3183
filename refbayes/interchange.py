"""Parameter interchange: ``rb.MLP`` / ``rb.Linear`` flat vectors to and from other libraries' layouts.

A refbayes network is a flat vector ``theta`` (P,) laid out, for each layer l = 0..L-1 in order, as

    theta = [ vec(W_0), b_0, vec(W_1), b_1, ... ],   W_l (n_{l+1}, n_l) flattened row by row (C order)

(see :mod:`refbayes.models`; ``Linear(bias=False)`` has no b). The functions here read and write the
same weights in the layouts other libraries store them in, so a network trained elsewhere can seed a
filter and a filtered mean can be checked against another implementation's forward pass:

==========  =================================================  ====================  =========
layout      container                                          weight shape          forward
==========  =================================================  ====================  =========
PyTorch     ``{"0.weight", "0.bias", "2.weight", ...}``        (out, in) = W_l       x W^T + b
flax        ``{"params": {"Dense_0": {"kernel", "bias"}}}``    (in, out) = W_l^T     x K + b
haiku       ``{"linear": {"w", "b"}, "linear_1": ...}``        (in, out) = W_l^T     x w + b
Keras       ``[kernel_0, bias_0, kernel_1, bias_1, ...]``      (in, out) = W_l^T     x K + b
==========  =================================================  ====================  =========

The activations are not part of any of these containers: the caller's network must use the
refbayes model's activation between layers and none after the last. ``docs/interchange.md`` gives
the orderings in full. Arrays come back as float64 NumPy copies; inputs may be NumPy arrays,
nested lists, or tensors (anything with ``.detach()``, ``.cpu()`` or ``.numpy()``, or that
``np.asarray`` accepts, such as jax arrays); torch, jax and tensorflow are never imported.

Every reader checks the whole container before building theta and raises ``ValueError`` naming
the key (or list position), the shape expected and the shape received; a container with entries
that do not belong to the network raises too (``strict=False`` ignores them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .models import MLP, Linear

__all__ = [
    "layer_shapes",
    "to_layers",
    "from_layers",
    "to_torch_state_dict",
    "from_torch_state_dict",
    "to_flax",
    "from_flax",
    "to_haiku",
    "from_haiku",
    "to_keras",
    "from_keras",
]


# ---------------------------------------------------------------------------------------------
# layers of a model
# ---------------------------------------------------------------------------------------------


def layer_shapes(model: MLP | Linear) -> list[tuple[int, int, bool]]:
    """[(n_in, n_out, has_bias), ...], one entry per affine layer of ``model`` in theta order.

    model: an ``rb.MLP`` or ``rb.Linear``; any other model has no layer structure to exchange
    (TypeError).
    """
    if isinstance(model, MLP):
        s = model.layer_sizes
        return [(s[l], s[l + 1], True) for l in range(model.n_layers)]
    if isinstance(model, Linear):
        return [(model.in_dim, model.out_dim, model.bias)]
    raise TypeError(f"model must be an rb.MLP or rb.Linear (a layered network); got {type(model).__name__}")


def to_layers(model: MLP | Linear, theta: ArrayLike) -> list[tuple[NDArray[np.float64], NDArray[np.float64] | None]]:
    """theta (P,) -> [(W_0, b_0), ...] with W_l (n_out, n_in) and b_l (n_out,) (None without bias).

    Copies; the refbayes (out, in) orientation. Raises ValueError for a theta of the wrong shape.
    """
    shapes = layer_shapes(model)
    theta = np.array(model.validate_theta(theta), dtype=np.float64, copy=True)
    out, pos = [], 0
    for n_in, n_out, has_bias in shapes:
        W = theta[pos:pos + n_out * n_in].reshape(n_out, n_in).copy()
        pos += n_out * n_in
        b = None
        if has_bias:
            b = theta[pos:pos + n_out].copy()
            pos += n_out
        out.append((W, b))
    return out


def from_layers(model: MLP | Linear, layers: Sequence[tuple[ArrayLike, ArrayLike | None]], *,
                names: Sequence[str] | None = None) -> NDArray[np.float64]:
    """[(W_0, b_0), ...] with W_l (n_out, n_in) -> theta (P,).

    b_l must be None exactly when the layer has no bias. names: labels used in error messages
    (default "W_l" / "b_l"). All shapes are checked before theta is built.
    """
    shapes = layer_shapes(model)
    layers = list(layers)
    if len(layers) != len(shapes):
        raise ValueError(f"expected {len(shapes)} layers for {model!r}; got {len(layers)}")
    parts = []
    for l, ((n_in, n_out, has_bias), (W, b)) in enumerate(zip(shapes, layers)):
        wname, bname = names[l] if names is not None else (f"W_{l}", f"b_{l}")
        parts.append(_array(W, wname, (n_out, n_in)).ravel())
        if has_bias:
            if b is None:
                raise ValueError(f"{bname}: layer {l} has a bias of shape ({n_out},) in the model but none was given")
            parts.append(_array(b, bname, (n_out,)))
        elif b is not None:
            raise ValueError(f"{bname}: layer {l} has no bias in the model (Linear(bias=False)); got one of "
                             f"shape {np.shape(_to_numpy(b, bname))}")
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------
# conversions of single arrays
# ---------------------------------------------------------------------------------------------


def _to_numpy(value, name):
    """A tensor-like (torch tensor, jax array, list, ndarray) as a NumPy array, without importing its library."""
    if hasattr(value, "detach") and callable(value.detach):
        value = value.detach()
    if hasattr(value, "cpu") and callable(value.cpu) and not isinstance(value, np.ndarray):
        value = value.cpu()
    if hasattr(value, "numpy") and callable(value.numpy) and not isinstance(value, np.ndarray):
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise TypeError(f"{name} must be an array or tensor; could not convert {type(value).__name__}: {exc}") from None
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must hold real numbers; got dtype {arr.dtype}")
    return arr


def _shape_str(shape):
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _array(value, name, shape):
    arr = _to_numpy(value, name)
    if arr.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {_shape_str(shape)}, got shape {_shape_str(arr.shape)}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _trailing_int(name, default):
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else default


def _check_unused(container, used, strict, what):
    if not strict:
        return
    extra = [k for k in container if k not in used]
    if extra:
        raise ValueError(f"{what} has entries that are not layers of the model: {sorted(map(str, extra))} "
                         "(pass strict=False to ignore them)")


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------


def _torch_default_indices(model):
    if isinstance(model, Linear):
        return [None]
    return [2 * l for l in range(model.n_layers)]


def _torch_key(prefix, index, kind):
    return f"{prefix}{kind}" if index is None else f"{prefix}{index}.{kind}"


def to_torch_state_dict(model: MLP | Linear, theta: ArrayLike, *, prefix: str = "",
                        indices: Sequence[int] | None = None) -> dict[str, NDArray[np.float64]]:
    """theta (P,) -> a PyTorch ``state_dict`` of NumPy arrays, in the network's layer order.

    For an ``MLP`` the keys are those of ``nn.Sequential(Linear, act, Linear, act, ..., Linear)``:
    ``f"{prefix}{i}.weight"`` with shape (n_out, n_in) (= W_l, the same orientation as refbayes)
    and ``f"{prefix}{i}.bias"`` (n_out,), for i in ``indices`` (default 0, 2, 4, ...: one activation
    module between the linear layers). For a ``Linear`` the default is one ``nn.Linear``:
    keys ``prefix + "weight"`` and ``prefix + "bias"`` (no bias key when bias=False); pass
    ``indices=[0]`` for a one-layer Sequential.

    Load into torch with ``net.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})``
    (torch casts float64 to the module's dtype).
    """
    layers = to_layers(model, theta)
    indices = _torch_default_indices(model) if indices is None else list(indices)
    if len(indices) != len(layers):
        raise ValueError(f"indices must have one entry per layer ({len(layers)}); got {len(indices)}")
    sd = {}
    for idx, (W, b) in zip(indices, layers):
        sd[_torch_key(prefix, idx, "weight")] = W
        if b is not None:
            sd[_torch_key(prefix, idx, "bias")] = b
    return sd


def _infer_torch_indices(model, keys, prefix):
    """The module indices of the linear layers: keys f"{prefix}{i}.weight", sorted by i."""
    if isinstance(model, Linear) and f"{prefix}weight" in keys:
        return [None]
    pat = re.compile(re.escape(prefix) + r"(\d+)\.weight$")
    found = sorted(int(m.group(1)) for k in keys if (m := pat.fullmatch(k)) is not None)
    return found


def _infer_torch_prefix(model, keys):
    """The common prefix of the '<i>.weight' keys ('' for a bare Sequential, 'module.' after
    DataParallel, 'net.' for a Sequential stored as an attribute)."""
    if isinstance(model, Linear) and "weight" in keys:
        return ""
    prefixes = set()
    for k in keys:
        m = re.fullmatch(r"(.*?)(\d+)\.weight", k)
        if m:
            prefixes.add(m.group(1))
    if not prefixes and isinstance(model, Linear):
        wkeys = [k for k in keys if k == "weight" or k.endswith(".weight")]
        if len(wkeys) == 1:
            return wkeys[0][: -len("weight")]
    if len(prefixes) != 1:
        raise ValueError(f"cannot infer the key prefix of the linear layers from keys {sorted(keys)}; "
                         "pass prefix= (and indices=)")
    return prefixes.pop()


def _one_per_layer(model, shapes, given, name, infer, describe):
    """The per-layer keys (Sequential indices or layer names) that the caller gave, or else the
    ones ``infer()`` finds; either way exactly one per layer of ``model`` (ValueError otherwise,
    ``describe(found)`` saying what was found)."""
    if given is None:
        found = infer()
        if len(found) != len(shapes):
            raise ValueError(f"{describe(found)}; the model has {len(shapes)} ({model!r})")
        return found
    given = list(given)
    if len(given) != len(shapes):
        raise ValueError(f"{name} must have one entry per layer ({len(shapes)}); got {len(given)}")
    return given


def from_torch_state_dict(model: MLP | Linear, state_dict: Mapping[str, Any], *, prefix: str | None = None,
                          indices: Sequence[int] | None = None, strict: bool = True) -> NDArray[np.float64]:
    """A PyTorch ``state_dict`` (NumPy arrays or tensors) -> theta (P,).

    prefix: the text before the layer index (e.g. "module." or "net."); None infers it.
    indices: the Sequential indices of the linear layers in order; None takes every
    ``f"{prefix}{i}.weight"`` key sorted by i (for a ``Linear``, a bare ``prefix + "weight"``
    key if present). weight (n_out, n_in), bias (n_out,) per layer, as ``to_torch_state_dict``.
    strict: entries that are not the network's weights raise ValueError (False ignores them).
    """
    if not hasattr(state_dict, "keys"):
        raise TypeError(f"state_dict must be a mapping of names to arrays; got {type(state_dict).__name__}")
    keys = list(state_dict.keys())
    shapes = layer_shapes(model)
    if prefix is None:
        prefix = _infer_torch_prefix(model, keys)
    indices = _one_per_layer(model, shapes, indices, "indices", lambda: _infer_torch_indices(model, keys, prefix),
                             lambda found: f"state_dict has {len(found)} linear layers (keys {prefix!r}<i>.weight)")
    layers, names, used = [], [], set()
    for idx, (n_in, n_out, has_bias) in zip(indices, shapes):
        wk, bk = _torch_key(prefix, idx, "weight"), _torch_key(prefix, idx, "bias")
        if wk not in state_dict:
            raise ValueError(f"state_dict has no key {wk!r} (expected shape {_shape_str((n_out, n_in))})")
        if has_bias and bk not in state_dict:
            raise ValueError(f"state_dict has no key {bk!r} (expected shape ({n_out},))")
        used.update([wk, bk] if bk in state_dict else [wk])
        layers.append((state_dict[wk], state_dict.get(bk)))
        names.append((repr(wk), repr(bk)))
    _check_unused(state_dict, used, strict, "state_dict")
    return from_layers(model, layers, names=names)


# ---------------------------------------------------------------------------------------------
# flax and haiku (nested dicts, kernel (in, out))
# ---------------------------------------------------------------------------------------------


def _to_nested(model, theta, names, wkey, bkey):
    layers = to_layers(model, theta)
    if len(names) != len(layers):
        raise ValueError(f"names must have one entry per layer ({len(layers)}); got {len(names)}")
    out = {}
    for name, (W, b) in zip(names, layers):
        entry = {wkey: np.ascontiguousarray(W.T)}
        if b is not None:
            entry[bkey] = b
        out[name] = entry
    return out


def _from_nested(model, tree, names, wkey, bkey, order_default, strict, what):
    if not hasattr(tree, "keys"):
        raise TypeError(f"{what} must be a mapping of layer names to {{{wkey!r}, {bkey!r}}}; got {type(tree).__name__}")
    shapes = layer_shapes(model)
    names = _one_per_layer(
        model, shapes, names, "names",
        lambda: sorted((k for k in tree.keys() if hasattr(tree[k], "keys") and wkey in tree[k]),
                       key=lambda k: (_trailing_int(str(k), order_default), str(k))),
        lambda found: f"{what} has {len(found)} layers with a {wkey!r} entry ({found})")
    layers, labels = [], []
    for name, (n_in, n_out, has_bias) in zip(names, shapes):
        if name not in tree or not hasattr(tree[name], "keys"):
            raise ValueError(f"{what} has no layer {name!r}")
        entry = tree[name]
        if wkey not in entry:
            raise ValueError(f"{what}[{name!r}] has no {wkey!r} (expected shape {_shape_str((n_in, n_out))})")
        if has_bias and bkey not in entry:
            raise ValueError(f"{what}[{name!r}] has no {bkey!r} (expected shape ({n_out},))")
        if strict:
            extra = [k for k in entry if k not in (wkey, bkey)]
            if extra:
                raise ValueError(f"{what}[{name!r}] has entries that are not weights: {sorted(map(str, extra))} "
                                 "(pass strict=False to ignore them)")
        kernel = _array(entry[wkey], f"{what}[{name!r}][{wkey!r}]", (n_in, n_out))
        layers.append((kernel.T, entry.get(bkey)))
        labels.append((f"{what}[{name!r}][{wkey!r}]", f"{what}[{name!r}][{bkey!r}]"))
    _check_unused(tree, set(names), strict, what)
    return from_layers(model, layers, names=labels)


def to_flax(model: MLP | Linear, theta: ArrayLike, *, names: Sequence[str] | None = None,
            wrap: bool = True) -> dict[str, Any]:
    """theta (P,) -> flax linen parameters ``{"params": {"Dense_0": {"kernel", "bias"}, ...}}``.

    kernel (n_in, n_out) = W_l^T (flax computes x @ kernel + bias), bias (n_out,) (absent for
    ``Linear(bias=False)``, flax's ``use_bias=False``). names: the layer names in order (default
    "Dense_0", "Dense_1", ...; an ``nn.Sequential`` names them "layers_0", "layers_2", ...).
    wrap: put the layers under a top-level "params" collection.
    """
    names = [f"Dense_{l}" for l in range(len(layer_shapes(model)))] if names is None else list(names)
    tree = _to_nested(model, theta, names, "kernel", "bias")
    return {"params": tree} if wrap else tree


def from_flax(model: MLP | Linear, params: Mapping[str, Any], *, names: Sequence[str] | None = None,
              strict: bool = True) -> NDArray[np.float64]:
    """flax linen parameters -> theta (P,).

    params: ``{"params": {...}}`` or the inner dict; each layer ``{"kernel": (n_in, n_out),
    "bias": (n_out,)}``. names: the layer names in order; None takes every entry holding a
    "kernel", ordered by the integer that ends its name (Dense_0, Dense_1, ..., Dense_10).
    Works on frozen dicts too. strict: other entries raise ValueError.
    """
    if hasattr(params, "keys") and "params" in params and hasattr(params["params"], "keys"):
        others = [k for k in params if k != "params"]
        if others and strict:
            raise ValueError(f"params has collections besides 'params': {sorted(map(str, others))} "
                             "(pass strict=False to ignore them)")
        params = params["params"]
    return _from_nested(model, params, names, "kernel", "bias", 0, strict, "params")


def to_haiku(model: MLP | Linear, theta: ArrayLike, *, names: Sequence[str] | None = None) -> dict[str, Any]:
    """theta (P,) -> haiku parameters ``{"linear": {"w", "b"}, "linear_1": {...}, ...}``.

    w (n_in, n_out) = W_l^T (haiku computes x @ w + b), b (n_out,). names: the module names in
    order; the default is haiku's naming of successive ``hk.Linear`` modules in one transform
    ("linear", "linear_1", "linear_2", ...). ``hk.nets.MLP`` uses "mlp/~/linear_0", "mlp/~/linear_1", ...
    """
    n = len(layer_shapes(model))
    names = ["linear"] + [f"linear_{l}" for l in range(1, n)] if names is None else list(names)
    return _to_nested(model, theta, names, "w", "b")


def from_haiku(model: MLP | Linear, params: Mapping[str, Any], *, names: Sequence[str] | None = None,
               strict: bool = True) -> NDArray[np.float64]:
    """haiku parameters -> theta (P,). Each module ``{"w": (n_in, n_out), "b": (n_out,)}``.

    names: module names in order; None takes every entry holding a "w", ordered by the integer
    that ends its name, a name without one ("linear") first. strict: other entries raise ValueError.
    """
    return _from_nested(model, params, names, "w", "b", -1, strict, "params")


# ---------------------------------------------------------------------------------------------
# Keras
# ---------------------------------------------------------------------------------------------


def to_keras(model: MLP | Linear, theta: ArrayLike) -> list[NDArray[np.float64]]:
    """theta (P,) -> ``[kernel_0, bias_0, kernel_1, bias_1, ...]`` as ``model.get_weights()`` lists
    them for a stack of ``Dense`` layers: kernel (n_in, n_out) = W_l^T, bias (n_out,) (no bias
    entry for ``Linear(bias=False)``, Keras's ``use_bias=False``). ``set_weights`` accepts it."""
    out = []
    for W, b in to_layers(model, theta):
        out.append(np.ascontiguousarray(W.T))
        if b is not None:
            out.append(b)
    return out


def from_keras(model: MLP | Linear, weights: Sequence[ArrayLike]) -> NDArray[np.float64]:
    """``[kernel_0, bias_0, ...]`` (Keras ``get_weights()`` order) -> theta (P,)."""
    if hasattr(weights, "keys") or isinstance(weights, (str, bytes)):
        raise TypeError(f"weights must be a list of arrays [kernel_0, bias_0, ...]; got {type(weights).__name__}")
    weights = list(weights)
    shapes = layer_shapes(model)
    expected = sum(2 if has_bias else 1 for _, _, has_bias in shapes)
    if len(weights) != expected:
        raise ValueError(f"weights must have {expected} arrays (kernel and bias per layer) for {model!r}; "
                         f"got {len(weights)}")
    layers, labels, pos = [], [], 0
    for l, (n_in, n_out, has_bias) in enumerate(shapes):
        kernel = _array(weights[pos], f"weights[{pos}] (kernel of layer {l})", (n_in, n_out))
        b = None
        if has_bias:
            b = weights[pos + 1]
            labels.append((f"weights[{pos}]", f"weights[{pos + 1}] (bias of layer {l})"))
        else:
            labels.append((f"weights[{pos}]", f"weights[{pos}]"))
        pos += 2 if has_bias else 1
        layers.append((kernel.T, b))
    return from_layers(model, layers, names=labels)
