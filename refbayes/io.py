"""Saving and loading beliefs as .npz files.

The file stores the belief's class name, a format version and its arrays
exactly as they are, so a save/load round trip is bit-exact.
"""

import os

import numpy as np

from . import beliefs

__all__ = ["save", "load", "FORMAT_VERSION"]

FORMAT_VERSION = 1


def _types():
    from .filters.lofi import LoFiBelief

    return {cls.__name__: cls for cls in (beliefs.FullCov, beliefs.Diag, beliefs.DLR, beliefs.BlockDiag, LoFiBelief)}


def save(belief, path):
    """Write ``belief`` to ``path`` (.npz). Returns the path written."""
    name = type(belief).__name__
    types = _types()
    if name not in types or type(belief) is not types[name]:
        raise TypeError(f"belief must be one of {sorted(types)}; got {type(belief).__name__}")
    arrays = {"__type__": np.array(name), "__version__": np.array(FORMAT_VERSION)}
    if isinstance(belief, beliefs.BlockDiag):
        arrays["mean"] = belief.mean
        arrays["n_blocks"] = np.array(len(belief.groups))
        for i, (g, c) in enumerate(zip(belief.groups, belief.covs)):
            arrays[f"group_{i}"] = g
            arrays[f"cov_{i}"] = c
    else:
        for field in type(belief).__dataclass_fields__:
            value = getattr(belief, field)
            if value is not None:  # optional fields left unset take their default on load
                arrays[field] = value
    path = os.fspath(path)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load(path):
    """Read a belief written by :func:`save`."""
    with np.load(os.fspath(path), allow_pickle=False) as data:
        if "__type__" not in data or "__version__" not in data:
            raise ValueError(f"{path} is not a refbayes belief file")
        version = int(data["__version__"])
        if version > FORMAT_VERSION:
            raise ValueError(f"{path} has format version {version}; this refbayes reads up to {FORMAT_VERSION}")
        name = str(data["__type__"])
        types = _types()
        if name not in types:
            raise ValueError(f"{path} holds an unknown belief type {name!r}")
        if name == "BlockDiag":
            n = int(data["n_blocks"])
            return beliefs.BlockDiag(
                data["mean"],
                tuple(data[f"group_{i}"] for i in range(n)),
                tuple(data[f"cov_{i}"] for i in range(n)),
            )
        cls = types[name]
        fields = {}
        for field in cls.__dataclass_fields__:
            if field in data:
                value = data[field]
                fields[field] = value.item() if value.ndim == 0 else value
        return cls(**fields)
