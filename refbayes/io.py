"""Saving and loading beliefs as .npz files.

The file stores the belief's class name, a format version and its arrays
exactly as they are, so a save/load round trip is bit-exact. Beliefs with a
variable number of arrays store a count and numbered keys: BlockDiag
(``n_blocks``, ``group_{i}``, ``cov_{i}``) and ReplayBelief (``n_buffer``,
``input_{i}``, ``target_{i}``, oldest first, plus ``mean``, ``opt_m``,
``opt_v``, ``n_steps``). A file that lacks a key or holds a value of the
wrong kind raises ValueError naming the file and the key.
"""

import dataclasses
import os
import re

import numpy as np

from . import beliefs

__all__ = ["save", "load", "FORMAT_VERSION"]

FORMAT_VERSION = 1

# beliefs with numbered keys: type name -> (count key, numbered key prefixes)
_NUMBERED = {"BlockDiag": ("n_blocks", ("group", "cov")), "ReplayBelief": ("n_buffer", ("input", "target"))}


def _types():
    from .filters.lofi import LoFiBelief
    from .filters.replay import ReplayBelief

    classes = (beliefs.FullCov, beliefs.Diag, beliefs.DLR, beliefs.BlockDiag, LoFiBelief, ReplayBelief)
    return {cls.__name__: cls for cls in classes}


def save(belief, path):
    """Write ``belief`` to ``path`` (.npz). Returns the path written.

    belief: FullCov, Diag, BlockDiag, DLR, LoFiBelief or ReplayBelief.
    """
    name = type(belief).__name__
    types = _types()
    if name not in types or type(belief) is not types[name]:
        raise TypeError(f"belief must be one of {sorted(types)}; got {type(belief).__name__}")
    arrays = {"__type__": np.array(name), "__version__": np.array(FORMAT_VERSION)}
    if name == "BlockDiag":
        arrays["mean"] = belief.mean
        arrays["n_blocks"] = np.array(len(belief.groups))
        for i, (g, c) in enumerate(zip(belief.groups, belief.covs)):
            arrays[f"group_{i}"] = g
            arrays[f"cov_{i}"] = c
    elif name == "ReplayBelief":
        for field in ("mean", "opt_m", "opt_v"):
            arrays[field] = getattr(belief, field)
        arrays["n_steps"] = np.array(belief.n_steps, dtype=np.int64)
        arrays["n_buffer"] = np.array(len(belief.inputs), dtype=np.int64)
        for i, (x, y) in enumerate(zip(belief.inputs, belief.targets)):
            arrays[f"input_{i}"] = x
            arrays[f"target_{i}"] = y
    else:
        for field in type(belief).__dataclass_fields__:
            value = getattr(belief, field)
            if value is not None:  # optional fields left unset take their default on load
                arrays[field] = value
    path = os.fspath(path)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


class _Malformed(ValueError):
    """A file with a missing or ill-typed key (raised as is by ``load``)."""


def _get(data, key, path, name):
    if key not in data:
        raise _Malformed(f"{path} is a malformed {name} file: key {key!r} is missing")
    return data[key]


def _count(data, key, path, name):
    value = _get(data, key, path, name)
    if value.ndim != 0 or value.dtype.kind not in "iu" or int(value) < 0:
        raise _Malformed(f"{path} is a malformed {name} file: {key!r} must be an integer >= 0; "
                         f"got {value.dtype} array of shape {value.shape}")
    return int(value)


def _numbered(data, path, name):
    """The numbered arrays of a BlockDiag / ReplayBelief file: a tuple per prefix."""
    count_key, prefixes = _NUMBERED[name]
    n = _count(data, count_key, path, name)
    pattern = re.compile(rf"({'|'.join(prefixes)})_(\d+)")
    for key in data.files:
        m = pattern.fullmatch(key)
        if m and int(m.group(2)) >= n:
            raise _Malformed(f"{path} is a malformed {name} file: key {key!r} but {count_key} = {n}")
    return tuple(tuple(_get(data, f"{p}_{i}", path, name) for i in range(n)) for p in prefixes)


def _scalar(data, key, path, name):
    value = _get(data, key, path, name)
    if value.ndim != 0:
        raise _Malformed(f"{path} is a malformed {name} file: {key!r} must be a scalar; got shape {value.shape}")
    return value.item()


def _fields(data, cls, path, name):
    """Constructor arguments for a belief whose fields are stored one key each."""
    out = {}
    for field in dataclasses.fields(cls):
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if field.name in data:
            value = data[field.name]
            out[field.name] = value.item() if value.ndim == 0 else value
        elif required:
            _get(data, field.name, path, name)  # raises
    return out


def load(path):
    """Read a belief written by :func:`save`. Returns a new belief of the stored type.

    Raises ValueError for a file that is not a refbayes belief file, has a newer
    format version, names an unknown type, lacks a key, or holds arrays that the
    belief's constructor rejects.
    """
    path = os.fspath(path)
    try:
        obj = np.load(path, allow_pickle=False)
    except ValueError as exc:  # e.g. pickled data, or not a NumPy file at all
        raise ValueError(f"{path} is not a refbayes belief file ({exc})") from exc
    if not isinstance(obj, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not a refbayes belief file (a single .npy array, not an .npz archive)")
    with obj as data:
        if "__type__" not in data or "__version__" not in data:
            raise ValueError(f"{path} is not a refbayes belief file")
        version, name = data["__version__"], data["__type__"]
        if version.ndim != 0 or version.dtype.kind not in "iu" or name.ndim != 0 or name.dtype.kind != "U":
            raise ValueError(f"{path} is not a refbayes belief file (bad __type__ / __version__ entries)")
        version, name = int(version), str(name)
        if version > FORMAT_VERSION:
            raise ValueError(f"{path} has format version {version}; this refbayes reads up to {FORMAT_VERSION}")
        types = _types()
        if name not in types:
            raise ValueError(f"{path} holds an unknown belief type {name!r}")
        cls = types[name]
        try:
            if name == "BlockDiag":
                groups, covs = _numbered(data, path, name)
                return cls(_get(data, "mean", path, name), groups, covs)
            if name == "ReplayBelief":
                inputs, targets = _numbered(data, path, name)
                return cls(
                    _get(data, "mean", path, name), inputs, targets,
                    opt_m=_get(data, "opt_m", path, name), opt_v=_get(data, "opt_v", path, name),
                    n_steps=_scalar(data, "n_steps", path, name),
                )
            return cls(**_fields(data, cls, path, name))
        except _Malformed:
            raise
        except (ValueError, TypeError) as exc:  # arrays the belief's constructor rejects
            raise ValueError(f"{path} holds an invalid {name}: {exc}") from exc
