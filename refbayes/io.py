"""Saving and loading beliefs as .npz files that a crash or a damaged disk cannot silently corrupt.

The file is an uncompressed zip of .npy members (what ``numpy.savez`` writes):
the belief's class name ``__type__``, the format version ``__version__``, a
SHA-256 of all other arrays ``__checksum__`` and the belief's arrays exactly as
they are, so a save/load round trip is bit-exact. Beliefs with a variable
number of arrays store a count and numbered keys: BlockDiag (``n_blocks``,
``group_{i}``, ``cov_{i}``) and ReplayBelief (``n_buffer``, ``input_{i}``,
``target_{i}``, oldest first, plus ``mean``, ``opt_m``, ``opt_v``,
``n_steps``). The full layout and the validation rules are in
docs/file-format.md.

``save`` never leaves a half-written file at ``path``: it writes a temporary
file in the same directory, flushes and fsyncs it and renames it onto ``path``
(an atomic replace), so after a crash, a kill or a full disk ``path`` holds
either the previous file or the new one, complete.

``load`` reads only numeric and string arrays (never pickles), checks every
member's size against its header before allocating, verifies the checksum
when the file has one (files written before it was added load without it) and
validates the belief before returning it. Any damaged, truncated, foreign or
wrong-version file raises ValueError naming the file and the problem; a
missing file raises FileNotFoundError.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
import zipfile
from typing import TYPE_CHECKING

import numpy as np

from . import beliefs
from .beliefs import Belief

if TYPE_CHECKING:
    from .filters.replay import ReplayBelief

__all__ = ["save", "load", "FORMAT_VERSION", "SUPPORTED_VERSIONS"]

FORMAT_VERSION = 1
"""The version ``save`` writes."""

SUPPORTED_VERSIONS = (1,)
"""The versions ``load`` reads. ``__checksum__`` is an optional key of version 1 (verified when present)."""

TYPE_KEY, VERSION_KEY, CHECKSUM_KEY = "__type__", "__version__", "__checksum__"
_META = (TYPE_KEY, VERSION_KEY, CHECKSUM_KEY)
_CHECKSUM_PREFIX = "sha256:"

# FullCov / BlockDiag symmetry tolerance, relative to the largest |entry| (the FullCov constructor's rule;
# docs/file-format.md explains why round-off stays far below it).
SYMMETRY_RTOL = 1e-10

# beliefs with numbered keys: type name -> (count key, numbered key prefixes, other keys)
_NUMBERED = {
    "BlockDiag": ("n_blocks", ("group", "cov"), ("mean",)),
    "ReplayBelief": ("n_buffer", ("input", "target"), ("mean", "opt_m", "opt_v", "n_steps")),
}
# keys holding integers (all other data keys hold float64)
_INTEGER_KEYS = {"n_blocks", "n_buffer", "n_steps", "n_obs"}


def _types():
    from .filters.lofi import LoFiBelief
    from .filters.replay import ReplayBelief

    classes = (beliefs.FullCov, beliefs.Diag, beliefs.DLR, beliefs.BlockDiag, LoFiBelief, ReplayBelief)
    return {cls.__name__: cls for cls in classes}


# -- checks shared by save and load ------------------------------------------------------------------------

def _check_spd(cov, what):
    """Symmetric to SYMMETRY_RTOL * max|cov| and positive definite (a Cholesky factor exists)."""
    scale = np.abs(cov).max(initial=0.0)
    asym = np.abs(cov - cov.T).max(initial=0.0)
    if asym > SYMMETRY_RTOL * scale:
        raise ValueError(f"{what} is not symmetric: max |C - C^T| = {asym:.3g} > {SYMMETRY_RTOL:g} * max |C| "
                         f"= {SYMMETRY_RTOL * scale:.3g}")
    try:
        np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        raise ValueError(f"{what} is not positive definite (its Cholesky factorisation fails)") from None


def _check_belief(bel):
    """The checks a belief's constructor does not make itself; raises ValueError naming the field.

    The constructors already reject non-finite arrays, wrong shapes (W (P, L),
    prior_mean / prior_prec / opt_m / opt_v (P,), BlockDiag blocks and groups),
    variances or precisions <= 0 and asymmetric FullCov covariances.
    """
    name = type(bel).__name__
    if name == "FullCov":
        _check_spd(bel.cov, "FullCov.cov")
    elif name == "BlockDiag":
        for i, c in enumerate(bel.covs):
            _check_spd(c, f"BlockDiag.covs[{i}]")
    elif name in ("Diag", "DLR", "LoFiBelief"):
        diag = bel.var if name == "Diag" else bel.ups
        if not (np.all(np.isfinite(diag)) and np.all(diag > 0)):
            raise ValueError(f"{name}.{'var' if name == 'Diag' else 'ups'} must be finite and > 0")
    elif name == "ReplayBelief":
        for field, items in (("inputs", bel.inputs), ("targets", bel.targets)):
            shapes = {x.shape for x in items}
            if len(shapes) > 1:
                raise ValueError(f"ReplayBelief.{field} must all have one shape; got {sorted(shapes)}")
            if not all(np.all(np.isfinite(x)) for x in items):
                raise ValueError(f"ReplayBelief.{field} contains NaN or inf")
        if np.any(bel.opt_v < 0):
            raise ValueError(f"ReplayBelief.opt_v (Adam's second moment) must be >= 0; got minimum {bel.opt_v.min()}")


def _digest(arrays):
    """SHA-256 over every non-meta array: key, dtype, shape, memory order and raw bytes, keys sorted."""
    h = hashlib.sha256(b"refbayes belief arrays\0")
    for key in sorted(arrays):
        if key in _META:
            continue
        a = arrays[key]
        fortran = a.flags.f_contiguous and not a.flags.c_contiguous  # the order numpy writes to the .npy
        raw = a.T if fortran else np.ascontiguousarray(a)
        h.update(f"{key}\0{a.dtype.str}\0{a.shape}\0{'F' if fortran else 'C'}\0".encode())
        h.update(raw.reshape(-1).view(np.uint8) if raw.size else b"")
    return _CHECKSUM_PREFIX + h.hexdigest()


# -- save --------------------------------------------------------------------------------------------------

def _arrays_of(belief, name):
    arrays = {TYPE_KEY: np.array(name), VERSION_KEY: np.array(FORMAT_VERSION, dtype=np.int64)}
    if name == "BlockDiag":
        arrays["mean"] = belief.mean
        arrays["n_blocks"] = np.array(len(belief.groups), dtype=np.int64)
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
            if field == "dtype":  # the arrays' own dtype records it
                continue
            value = getattr(belief, field)
            if value is not None:  # optional fields left unset take their default on load
                arrays[field] = np.array(value, dtype=np.int64) if field in _INTEGER_KEYS else np.asarray(value)
    # the checksum goes first in the archive: a damaged central directory that hides the later members
    # still shows it, and it covers the set of keys, so the loss is detected
    return {CHECKSUM_KEY: np.array(_digest(arrays)), **arrays}


def _write_arrays(fh, arrays):
    """Write the archive to the open binary file ``fh`` (the one place bytes are written; tests replace it)."""
    np.savez(fh, **arrays)


def _fsync_dir(directory):
    """Make a rename in ``directory`` durable, where the OS lets a directory be opened and fsynced."""
    if os.name == "nt" or not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to fsync a directory; the file itself is already synced
        pass
    finally:
        os.close(fd)


def _as_path(path):
    if isinstance(path, (bytes, bytearray)):
        return os.fsdecode(bytes(path))
    if isinstance(path, str) or isinstance(path, os.PathLike):
        out = os.fspath(path)
        return os.fsdecode(out) if isinstance(out, bytes) else out
    raise TypeError(f"path must be a str or os.PathLike; got {type(path).__name__}")


def save(belief: Belief | ReplayBelief, path: str | os.PathLike[str]) -> str:
    """Write ``belief`` to ``path`` atomically. Returns ``os.fspath(path)``.

    belief: FullCov, Diag, BlockDiag, DLR, LoFiBelief or ReplayBelief (a DeviceDLR or DeviceDiag, a
        belief on the GPU, is written as the DLR or Diag it holds; ``load`` gives it back on the host).
    path: str or os.PathLike. The file is written exactly at ``path``; no ".npz"
        is appended (unlike ``numpy.savez`` given a name). If ``path`` is a
        symbolic link, the file it points to is replaced and the link kept.

    The belief is first checked with the rules ``load`` applies (a FullCov or
    BlockDiag covariance must be symmetric and positive definite, O(P^3) for
    FullCov), so ``save`` never writes a file that ``load`` rejects; a belief
    that fails raises ValueError and nothing is written. The arrays go to a
    temporary file ``.<name>.<random>.tmp`` next to ``path``, which is flushed,
    fsynced and renamed onto ``path`` with ``os.replace``; the directory is then
    fsynced where the OS allows. On any error the temporary file is removed and
    ``path`` is untouched. A process killed mid-save can leave the temporary
    file behind (nothing can remove it); ``path`` is still the previous file.
    """
    if type(belief).__name__ in ("DeviceDLR", "DeviceDiag"):  # a belief on the GPU: written as the one it holds
        belief = belief.to_host()
    name = type(belief).__name__
    types = _types()
    if name not in types or type(belief) is not types[name]:
        raise TypeError(f"belief must be one of {sorted(types)}; got {type(belief).__name__}")
    shown = _as_path(path)
    try:
        _check_belief(belief)
    except ValueError as exc:
        raise ValueError(f"refusing to save a belief that load would reject ({shown}): {exc}") from None
    arrays = _arrays_of(belief, name)
    target = os.path.realpath(shown)  # write through a symlink instead of replacing it
    directory, base = os.path.split(target)
    mode = None
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        pass
    while True:
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:  # no such directory, no permission, ...: name the file asked for, not the temporary one
            raise type(exc)(exc.errno, f"cannot save to {shown!r}: {exc.strerror}", directory) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_arrays(fh, arrays)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # keep the permissions of the file being replaced
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return shown


# -- load --------------------------------------------------------------------------------------------------

class _Damaged(Exception):
    """Internal: the file cannot be a belief file; turned into ValueError(path + message) by ``load``."""


def _declared_entries(fh):
    """The member count in the zip end-of-central-directory record (None for zip64 archives).

    ``zipfile`` reads members until the directory's byte size is used up and does not compare the count,
    so a damaged size field could silently hide the last members.
    """
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - 22 - 65535))
    tail = fh.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None  # zipfile has accepted the archive; let its own checks stand
    total = int.from_bytes(tail[at + 10:at + 12], "little")
    return None if total == 0xFFFF else total


def _read_members(fh):
    """{key: array} from an open .npz file, checking each member before allocating its array."""
    try:
        zf = zipfile.ZipFile(fh)
    except zipfile.BadZipFile as exc:
        fh.seek(0)
        head = fh.read(6)
        what = ("a single .npy array" if head == b"\x93NUMPY" else "empty" if not head else
                "a pickle" if head[:1] == b"\x80" else f"not a zip archive: {exc}")
        raise _Damaged(f"it is not a refbayes belief file ({what}, not an .npz archive)") from None
    arrays = {}
    with zf:
        expected = _declared_entries(fh)
        if expected is not None and expected != len(zf.infolist()):
            raise _Damaged(f"its zip directory lists {len(zf.infolist())} members but its end record says {expected}")
        for info in zf.infolist():
            if not info.filename.endswith(".npy") or info.is_dir():
                raise _Damaged(f"it holds a member {info.filename!r} that is not a .npy array")
            key = info.filename[:-4]
            if key in arrays:
                raise _Damaged(f"it holds the key {key!r} twice")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise _Damaged(f"member {info.filename!r} uses an unsupported compression method {info.compress_type}")
            with zf.open(info) as fp:
                version = np.lib.format.read_magic(fp)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
                else:
                    raise _Damaged(f"member {info.filename!r} has an unsupported .npy version {version}")
                if dtype.hasobject or dtype.kind not in "biufcSU" or dtype.fields is not None:
                    raise _Damaged(f"key {key!r} holds an array of dtype {dtype}; belief files hold only "
                                   "numbers and strings")
                count = 1
                for s in shape:
                    count *= int(s)
                header = fp.tell()
                if info.file_size != header + count * dtype.itemsize:
                    raise _Damaged(f"member {info.filename!r} is {info.file_size} bytes but its header "
                                   f"describes {header + count * dtype.itemsize} (shape {shape}, dtype {dtype})")
            with zf.open(info) as fp:
                arr = np.lib.format.read_array(fp, allow_pickle=False)
                if fp.read(1) != b"":  # also makes zipfile compare the member's CRC-32
                    raise _Damaged(f"member {info.filename!r} has bytes after its array")
            arrays[key] = arr
    return arrays


def _malformed(name, msg):
    return _Damaged(f"it is a malformed {name} file: {msg}")


def _get(data, key, name):
    if key not in data:
        raise _malformed(name, f"key {key!r} is missing")
    return data[key]


def _count(data, key, name):
    value = _get(data, key, name)
    if value.ndim != 0 or value.dtype.kind not in "iu" or int(value) < 0:
        raise _malformed(name, f"{key!r} must be an integer >= 0; got {value.dtype} array of shape {value.shape}")
    return int(value)


def _scalar(data, key, name):
    value = _get(data, key, name)
    if value.ndim != 0:
        raise _malformed(name, f"{key!r} must be a scalar; got shape {value.shape}")
    return value.item()


def _check_dtypes(data, name):
    """BlockDiag groups hold integers and every float array holds the mean's dtype, float64 or (a
    float32 belief's; not ReplayBelief) float32; float scalars (obs_var) hold float64. What ``save``
    writes. Returns the belief's dtype.

    The integer counts and scalars (n_blocks, n_buffer, n_steps, n_obs) are checked where they are read.
    """
    mean = data.get("mean")
    single = (mean is not None and mean.dtype.kind == "f" and mean.dtype.itemsize == 4 and name != "ReplayBelief")
    dtype = np.dtype(np.float32) if single else np.dtype(np.float64)
    for key, value in data.items():
        if key in _META or key in _INTEGER_KEYS:
            continue
        if key.startswith("group_"):
            if value.dtype.kind not in "iu":
                raise _malformed(name, f"{key!r} must hold integer indices; got dtype {value.dtype}")
        elif value.ndim == 0 and not (value.dtype.kind == "f" and value.dtype.itemsize == 8):
            raise _malformed(name, f"{key!r} must hold a float64 scalar; got dtype {value.dtype}")
        elif value.ndim > 0 and not (value.dtype.kind == "f" and value.dtype.itemsize == dtype.itemsize):
            raise _malformed(name, f"{key!r} must hold {dtype} (the dtype of 'mean'); got dtype {value.dtype}")
    return dtype


def _numbered(data, name):
    """The numbered arrays of a BlockDiag / ReplayBelief file: a tuple per prefix; no other keys allowed."""
    count_key, prefixes, others = _NUMBERED[name]
    n = _count(data, count_key, name)
    pattern = re.compile(rf"({'|'.join(prefixes)})_(\d+)")
    allowed = set(_META) | {count_key} | set(others)
    for key in data:
        m = pattern.fullmatch(key)
        if m and int(m.group(2)) >= n:
            raise _malformed(name, f"key {key!r} but {count_key} = {n}")
        if not m and key not in allowed:
            raise _malformed(name, f"unexpected key {key!r}")
    return tuple(tuple(_get(data, f"{p}_{i}", name) for i in range(n)) for p in prefixes)


def _fields(data, cls, name):
    """Constructor arguments for a belief whose fields are stored one key each; no other keys allowed."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "dtype"}  # dtype: the arrays' own
    for key in data:
        if key not in fields and key not in _META:
            raise _malformed(name, f"unexpected key {key!r}")
    out = {}
    for field in fields.values():
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if field.name in data:
            value = data[field.name]
            out[field.name] = value.item() if value.ndim == 0 else value
        elif required:
            _get(data, field.name, name)  # raises
    return out


def _belief_from(data):
    if TYPE_KEY not in data or VERSION_KEY not in data:
        raise _Damaged(f"it is not a refbayes belief file (no {TYPE_KEY} / {VERSION_KEY} keys)")
    version, name = data[VERSION_KEY], data[TYPE_KEY]
    if name.ndim != 0 or name.dtype.kind != "U":
        raise _Damaged(f"it is not a refbayes belief file ({TYPE_KEY} must be a string; got {name.dtype} "
                       f"array of shape {name.shape})")
    if version.ndim != 0 or version.dtype.kind not in "iu":
        raise _Damaged(f"it is not a refbayes belief file ({VERSION_KEY} must be an integer scalar; got "
                       f"{version.dtype} array of shape {version.shape})")
    version, name = int(version), str(name)
    if version not in SUPPORTED_VERSIONS:
        newer = " (written by a newer refbayes)" if version > max(SUPPORTED_VERSIONS) else ""
        raise _Damaged(f"it has format version {version}{newer}; this refbayes reads versions "
                       f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
    types = _types()
    if name not in types:
        raise _Damaged(f"it holds an unknown belief type {name!r}")
    cls = types[name]
    # structure first (missing / unexpected keys, counts, dtypes), so a hand-edited file gets the precise
    # message; then the checksum; then the belief's own validation
    if name == "BlockDiag":
        groups, covs = _numbered(data, name)
        args, kwargs = (_get(data, "mean", name), groups, covs), {}
    elif name == "ReplayBelief":
        inputs, targets = _numbered(data, name)
        args = (_get(data, "mean", name), inputs, targets)
        kwargs = dict(opt_m=_get(data, "opt_m", name), opt_v=_get(data, "opt_v", name),
                      n_steps=_scalar(data, "n_steps", name))
    else:
        args, kwargs = (), _fields(data, cls, name)
    dtype = _check_dtypes(data, name)
    if name != "ReplayBelief":
        kwargs["dtype"] = dtype
    if CHECKSUM_KEY in data:
        stored = data[CHECKSUM_KEY]
        if stored.ndim != 0 or stored.dtype.kind != "U":
            raise _malformed(name, f"{CHECKSUM_KEY!r} must be a string; got {stored.dtype} array of shape {stored.shape}")
        if str(stored) != _digest(data):
            raise _Damaged("the checksum does not match: the arrays differ from the ones written (the file is "
                           "damaged or was edited without updating __checksum__)")
    try:
        bel = cls(*args, **kwargs)
        _check_belief(bel)
    except (ValueError, TypeError) as exc:  # arrays the belief's constructor or the checks reject
        raise _Damaged(f"it holds an invalid {name}: {exc}") from None
    return bel


def load(path: str | os.PathLike[str]) -> Belief | ReplayBelief:
    """Read a belief written by :func:`save`. Returns a new belief of the stored type.

    path: str or os.PathLike.

    Raises FileNotFoundError if ``path`` does not exist (other errors from
    opening it pass through too), and ValueError naming ``path`` and the problem
    for a file that is empty, truncated, damaged, not an .npz archive, not a
    refbayes belief file, of an unsupported format version, holding an object
    (pickled) array, failing its checksum, or holding a belief that fails
    validation (non-finite values, non-positive variances, a covariance that is
    not symmetric positive definite, inconsistent shapes). Nothing is unpickled.
    """
    shown = _as_path(path)
    with open(shown, "rb") as fh:
        try:
            data = _read_members(fh)
            return _belief_from(data)
        except _Damaged as exc:
            raise ValueError(f"{shown}: {exc}") from None
        except Exception as exc:  # any parser error on a damaged archive or .npy header
            if isinstance(exc, OSError) and exc.errno == errno.EIO:
                raise  # the disk failed to read, which says nothing about the file's bytes
            detail = str(exc)
            if "pickle" in detail:
                detail = "pickled data"
            raise ValueError(f"{shown}: it is not a readable refbayes belief file "
                             f"({type(exc).__name__}: {detail})") from exc
