"""rb.save / rb.load under damage: killed saves, full disks, truncated, flipped, foreign and hostile files.

Every damaged file must raise ValueError naming the file, or load a belief that is bit-identical to the
one written (a flip in bytes that carry no data); a save that fails or is killed must leave the previous
file in place, loadable and unchanged.
"""

import errno
import io
import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import refbayes as rb
import refbayes.io as rbio
from refbayes.filters.lofi import LoFiBelief


def spd(rng, n):
    A = rng.standard_normal((n, n))
    return A @ A.T / n + 0.5 * np.eye(n)


def corpus_beliefs():
    """One small belief of every stored type (with every optional field set where there is one)."""
    rng = np.random.default_rng(2026)
    P = 5
    mean = rng.standard_normal(P)
    groups = (np.array([3, 0]), np.array([1, 4, 2]))
    return {
        "FullCov": rb.FullCov(mean, spd(rng, P)),
        "Diag": rb.Diag(mean, rng.uniform(0.5, 2, P)),
        "BlockDiag": rb.BlockDiag(mean, groups, tuple(spd(rng, len(g)) for g in groups)),
        "DLR": rb.DLR(mean, rng.uniform(0.5, 2, P), rng.standard_normal((P, 2))),
        "LoFiBelief": LoFiBelief(mean, rng.uniform(0.5, 2, P), np.asfortranarray(rng.standard_normal((P, 2))),
                                 obs_var=0.3, n_obs=4, prior_mean=rng.standard_normal(P),
                                 prior_prec=rng.uniform(1, 2, P)),
        "ReplayBelief": rb.ReplayBelief(mean, tuple(rng.standard_normal((2, 3))), tuple(rng.standard_normal((2, 1))),
                                        opt_m=rng.standard_normal(P), opt_v=rng.uniform(0, 1, P), n_steps=9),
    }


def same(a, b):
    """Same type and bit-identical fields (arrays with dtype and shape, tuples of arrays, scalars)."""
    if type(a) is not type(b):
        return False
    for name in type(a).__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, tuple):
            if len(x) != len(y) or not all(same_array(u, v) for u, v in zip(x, y)):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and same_array(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def same_array(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def expect_value_error(path, forbid=("allow_pickle",)):
    with pytest.raises(ValueError) as info:
        rb.load(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for word in forbid:
        assert word not in msg, msg
    return msg


def load_outcome(path, original):
    """'error' (ValueError naming the file), or 'same' (loads bit-identical); anything else fails."""
    try:
        back = rb.load(path)
    except ValueError as exc:
        assert str(path) in str(exc), str(exc)
        assert "allow_pickle" not in str(exc)
        return "error"
    assert same(back, original), f"{path} loaded a belief that differs from the one written"
    return "same"


BELIEFS = corpus_beliefs()


# --- corrupted-file corpus ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(BELIEFS))
def test_truncations_at_20_offsets_raise(tmp_path, kind):
    good = tmp_path / "good.npz"
    rb.save(BELIEFS[kind], good)
    raw = good.read_bytes()
    offsets = np.unique(np.linspace(0, len(raw) - 1, 20).astype(int))
    assert len(offsets) == 20
    for k in offsets:
        bad = tmp_path / f"trunc_{k}.npz"
        bad.write_bytes(raw[:k])
        expect_value_error(bad)


def member_data_bytes(raw):
    """Byte offsets that hold array members' contents (each .npy header and payload) in a stored archive."""
    zf = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    inside = set()
    for info in zf.infolist():
        at = info.header_offset
        name_len = int.from_bytes(raw[at + 26:at + 28], "little")
        extra_len = int.from_bytes(raw[at + 28:at + 30], "little")
        start = at + 30 + name_len + extra_len
        inside.update(range(start, start + info.compress_size))
    return inside


def flip_outcomes(tmp_path, kind, positions, masks):
    """Flip bits at each position; return the file and the positions whose damaged file loaded unchanged."""
    good = tmp_path / "good.npz"
    rb.save(BELIEFS[kind], good)
    raw = bytearray(good.read_bytes())
    bad = tmp_path / "flipped.npz"
    harmless = set()
    for pos in positions:
        for mask in masks:
            damaged = bytearray(raw)
            damaged[pos] ^= mask
            bad.write_bytes(bytes(damaged))
            if load_outcome(bad, BELIEFS[kind]) == "same":
                harmless.add(pos)
    return raw, harmless


def test_every_single_byte_flip_raises_or_loads_the_original(tmp_path):
    # LoFiBelief: the type with the most keys (a Fortran-ordered W, scalars, optional arrays).
    # load_outcome fails the test on anything but a named ValueError or a bit-identical belief.
    raw_len = Path(rb.save(BELIEFS["LoFiBelief"], tmp_path / "probe.npz")).stat().st_size
    raw, harmless = flip_outcomes(tmp_path, "LoFiBelief", range(raw_len), (0xFF, 0x01))
    data = member_data_bytes(raw)
    # a flip in any array's header or payload is caught; the only harmless flips are in zip bookkeeping
    # that the reader does not use (timestamps, version fields, the local copies of the directory entries)
    assert not harmless & data, sorted(harmless & data)[:20]
    assert len(data) > raw_len / 2  # the data region is most of the file, so the claim above covers most bytes


@pytest.mark.parametrize("kind", sorted(set(BELIEFS) - {"LoFiBelief"}))
def test_byte_flips_across_the_file_raise_or_load_the_original(tmp_path, kind):
    n = Path(rb.save(BELIEFS[kind], tmp_path / "probe.npz")).stat().st_size
    raw, harmless = flip_outcomes(tmp_path, kind, range(0, n, 3), (0x80, 0x10, 0x02))
    data = member_data_bytes(raw)
    assert not harmless & data, sorted(harmless & data)[:20]


def rezip(path, out, edit):
    """Rewrite the archive with member bytes changed by ``edit(name, bytes)``: the zip CRC-32s are recomputed,
    so only the stored SHA-256 can notice (what a flip in array data plus a repaired CRC looks like)."""
    with zipfile.ZipFile(path) as zf:
        members = [(info.filename, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            zf.writestr(name, edit(name, data))


def flip_last_data_byte(member):
    def edit(name, data):
        if name != member:
            return data
        data = bytearray(data)
        data[-1] ^= 0x04  # the last byte of the last float: a different, perfectly valid float64
        return bytes(data)
    return edit


@pytest.mark.parametrize("kind", sorted(BELIEFS))
def test_a_flip_inside_array_data_is_caught_by_the_checksum(tmp_path, kind):
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    rb.save(BELIEFS[kind], good)
    rezip(good, bad, flip_last_data_byte("mean.npy"))
    msg = expect_value_error(bad)
    assert "checksum does not match" in msg


def test_without_a_checksum_a_flip_inside_array_data_loads_a_different_belief(tmp_path):
    # Why the checksum is stored: a changed float is still a valid float. A file without __checksum__ (the
    # files written before it existed) with its zip CRC repaired loads, and differs from what was written.
    good, bare, bad = tmp_path / "good.npz", tmp_path / "bare.npz", tmp_path / "bad.npz"
    bel = BELIEFS["Diag"]
    rb.save(bel, good)
    with np.load(good) as data:
        np.savez(bare, **{k: data[k] for k in data.files if k != "__checksum__"})
    assert same(rb.load(bare), bel)  # old-style files still load
    rezip(bare, bad, flip_last_data_byte("mean.npy"))
    back = rb.load(bad)
    assert not np.array_equal(back.mean, bel.mean)
    np.testing.assert_array_equal(back.mean[:-1], bel.mean[:-1])


# --- files that are not belief files -------------------------------------------------------------------------

def test_empty_random_and_pickle_files_raise(tmp_path):
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    expect_value_error(empty)
    rng = np.random.default_rng(0)
    for i, n in enumerate((1, 7, 100, 5000)):
        junk = tmp_path / f"junk{i}.npz"
        junk.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        expect_value_error(junk)
    junk = tmp_path / "zip_magic.npz"  # starts like a zip, then garbage
    junk.write_bytes(b"PK\x03\x04" + rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    expect_value_error(junk)
    pkl = tmp_path / "belief.pkl"
    with open(pkl, "wb") as fh:
        pickle.dump({"__type__": "Diag", "mean": np.zeros(3)}, fh)
    expect_value_error(pkl, forbid=("allow_pickle",))
    npy_obj = tmp_path / "obj.npy"
    np.save(npy_obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    expect_value_error(npy_obj)


class Boom:
    def __reduce__(self):  # would run if anything unpickled it
        return (os.remove, ("/nonexistent-refbayes-sentinel",))


def test_an_object_array_is_never_unpickled(tmp_path):
    good = tmp_path / "good.npz"
    rb.save(BELIEFS["Diag"], good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    for key in ("mean", "extra", "__type__"):
        bad = tmp_path / f"obj_{key.strip('_')}.npz"
        np.savez(bad, **{**arrays, key: np.array([Boom()], dtype=object)})
        msg = expect_value_error(bad, forbid=("allow_pickle", "pickle"))
        assert "dtype object" in msg


def test_foreign_npz_files_raise(tmp_path):
    for i, arrays in enumerate([{"a": np.zeros(2)}, {"mean": np.zeros(3), "var": np.ones(3)},
                                {"__type__": np.array("Diag"), "mean": np.zeros(3)}, {}]):
        path = tmp_path / f"foreign{i}.npz"
        np.savez(path, **arrays)
        expect_value_error(path)
    path = tmp_path / "text.zip"  # a zip whose member is not an .npy
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("notes.txt", "hello")
    expect_value_error(path)


@pytest.mark.parametrize("version", [np.array(0), np.array(-1), np.array(2), np.array(2**40), np.array(1.0),
                                     np.array(True), np.array("1"), np.array([1]), np.array(1, dtype=np.uint8) + 1])
def test_wrong_versions_raise(tmp_path, version):
    good = tmp_path / "good.npz"
    rb.save(BELIEFS["Diag"], good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    bad = tmp_path / "bad.npz"
    np.savez(bad, **{**arrays, "__version__": version})
    msg = expect_value_error(bad)
    assert "version" in msg


def test_integer_versions_of_other_widths_are_accepted(tmp_path):
    good = tmp_path / "good.npz"
    rb.save(BELIEFS["Diag"], good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    for dtype in (np.int32, np.uint8):
        path = tmp_path / "v.npz"
        np.savez(path, **{**arrays, "__version__": np.array(1, dtype=dtype)})
        assert same(rb.load(path), BELIEFS["Diag"])


def test_a_missing_file_stays_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        rb.load(tmp_path / "nope.npz")


# --- validation of what is loaded (files without a checksum, built by hand) -------------------------------

def belief_file(tmp_path, type_name, **arrays):
    path = tmp_path / "hand.npz"
    np.savez(path, __type__=np.array(type_name), __version__=np.array(1), **arrays)
    return path


P3 = np.zeros(3)


@pytest.mark.parametrize("type_name, arrays, match", [
    ("FullCov", dict(mean=P3, cov=-np.eye(3)), "not positive definite"),
    ("FullCov", dict(mean=P3, cov=np.diag([1.0, 1.0, 0.0])), "not positive definite"),
    ("FullCov", dict(mean=P3, cov=np.eye(3) + np.triu(np.full((3, 3), 1e-6), 1)), "symmetric"),
    ("FullCov", dict(mean=np.array([0.0, np.inf, 0.0]), cov=np.eye(3)), "mean"),
    ("FullCov", dict(mean=P3, cov=np.eye(4)), "cov"),
    ("Diag", dict(mean=P3, var=np.array([1.0, 0.0, 1.0])), "var"),
    ("Diag", dict(mean=P3, var=np.array([1.0, -2.0, 1.0])), "var"),
    ("Diag", dict(mean=P3, var=np.array([1.0, np.inf, 1.0])), "var"),
    ("Diag", dict(mean=np.array([np.nan, 0, 0]), var=np.ones(3)), "mean"),
    ("Diag", dict(mean=P3, var=np.ones(3, dtype=np.float32)), "float64"),
    ("Diag", dict(mean=P3, var=np.ones(3), extra=np.ones(3)), "unexpected key 'extra'"),
    ("DLR", dict(mean=P3, ups=-np.ones(3), W=np.zeros((3, 1))), "ups"),
    ("DLR", dict(mean=P3, ups=np.ones(3), W=np.zeros((4, 1))), "W"),
    ("DLR", dict(mean=P3, ups=np.ones(3), W=np.full((3, 1), np.nan)), "W"),
    ("LoFiBelief", dict(mean=P3, ups=np.ones(3), W=np.zeros((3, 1)), prior_prec=-np.ones(3)), "prior_prec"),
    ("LoFiBelief", dict(mean=P3, ups=np.ones(3), W=np.zeros((3, 1)), prior_mean=np.zeros(2)), "prior_mean"),
    ("LoFiBelief", dict(mean=P3, ups=np.ones(3), W=np.zeros((3, 1)), obs_var=np.array(-1.0)), "obs_var"),
    ("LoFiBelief", dict(mean=P3, ups=np.ones(3), W=np.zeros((3, 1)), n_obs=np.array(-3)), "n_obs"),
    ("BlockDiag", dict(mean=P3, n_blocks=np.array(2), group_0=np.array([0]), cov_0=np.eye(1),
                       group_1=np.array([1, 2]), cov_1=np.array([[1.0, 2.0], [2.0, 1.0]])), "not positive definite"),
    ("BlockDiag", dict(mean=P3, n_blocks=np.array(1), group_0=np.array([0.0, 1.0, 2.0]), cov_0=np.eye(3)),
     "integer indices"),
    ("BlockDiag", dict(mean=P3, n_blocks=np.array(1), group_0=np.array([0, 1, 1]), cov_0=np.eye(3)), "partition"),
    ("ReplayBelief", dict(mean=P3, opt_m=P3, opt_v=P3, n_steps=np.array(1), n_buffer=np.array(2),
                          input_0=np.zeros(2), target_0=np.zeros(1), input_1=np.zeros(3), target_1=np.zeros(1)),
     "inputs must all have one shape"),
    ("ReplayBelief", dict(mean=P3, opt_m=P3, opt_v=P3, n_steps=np.array(1), n_buffer=np.array(2),
                          input_0=np.zeros(2), target_0=np.zeros(1), input_1=np.zeros(2), target_1=np.zeros(())),
     "targets must all have one shape"),
    ("ReplayBelief", dict(mean=P3, opt_m=P3, opt_v=-np.ones(3), n_steps=np.array(1), n_buffer=np.array(0)),
     "opt_v"),
    ("ReplayBelief", dict(mean=P3, opt_m=P3, opt_v=P3, n_steps=np.array(1), n_buffer=np.array(1),
                          input_0=np.array([np.nan]), target_0=np.zeros(1)), "inputs contains NaN"),
])
def test_loaded_beliefs_are_validated(tmp_path, type_name, arrays, match):
    path = belief_file(tmp_path, type_name, **arrays)
    msg = expect_value_error(path)
    assert match in msg, msg


def test_symmetry_tolerance_admits_round_off(tmp_path):
    # a covariance formed as A A^T in floating point is symmetric only up to round-off in some BLAS
    # orders; an asymmetry of a few ulps of the largest entry must load
    rng = np.random.default_rng(5)
    C = spd(rng, 6)
    C[0, 1] = np.nextafter(C[0, 1], np.inf)
    C[0, 1] = np.nextafter(C[0, 1], np.inf)
    back = rb.load(belief_file(tmp_path, "FullCov", mean=np.zeros(6), cov=C))
    assert back.cov.tobytes() == C.tobytes()


def test_save_refuses_a_belief_that_load_would_reject(tmp_path):
    path = tmp_path / "b.npz"
    rb.save(BELIEFS["Diag"], path)
    before = path.read_bytes()
    bad = rb.FullCov(np.zeros(3), -np.eye(3))  # symmetric, so the constructor takes it
    with pytest.raises(ValueError, match="not positive definite"):
        rb.save(bad, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["b.npz"]


# --- save: paths, permissions, failures -------------------------------------------------------------------

def test_save_path_semantics(tmp_path):
    bel = BELIEFS["DLR"]
    out = rb.save(bel, tmp_path / "plain")  # no suffix is added
    assert out == str(tmp_path / "plain") and isinstance(out, str)
    assert sorted(os.listdir(tmp_path)) == ["plain"]
    assert same(rb.load(out), bel)
    assert rb.save(bel, str(tmp_path / "s.npz")) == str(tmp_path / "s.npz")
    with pytest.raises(TypeError, match="path"):
        rb.save(bel, 3)
    with pytest.raises(TypeError, match="path"):
        rb.load(3.5)


def test_save_into_a_missing_or_closed_directory_names_the_path_asked_for(tmp_path):
    # the error names the file the user asked for, not the temporary file save writes first
    missing = tmp_path / "no-such-dir" / "b.npz"
    with pytest.raises(FileNotFoundError) as info:
        rb.save(BELIEFS["Diag"], missing)
    assert str(missing) in str(info.value) and ".tmp" not in str(info.value)
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o500)
    try:
        if os.access(closed, os.W_OK):  # root writes anywhere: nothing to check
            return
        with pytest.raises(PermissionError) as info:
            rb.save(BELIEFS["Diag"], closed / "b.npz")
        assert str(closed / "b.npz") in str(info.value) and ".tmp" not in str(info.value)
    finally:
        os.chmod(closed, 0o700)
    assert os.listdir(closed) == []


def test_save_keeps_the_mode_and_writes_through_a_symlink(tmp_path):
    bel_a, bel_b = BELIEFS["Diag"], BELIEFS["FullCov"]
    target = tmp_path / "real.npz"
    rb.save(bel_a, target)
    os.chmod(target, 0o640)
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    rb.save(bel_b, link)
    assert link.is_symlink() and same(rb.load(target), bel_b)
    assert (os.stat(target).st_mode & 0o777) == 0o640


class FullDisk(io.RawIOBase):
    """A writable file that raises ENOSPC once ``limit`` bytes have been written (the rest delegate)."""

    def __init__(self, fh, limit):
        self.fh, self.limit, self.written = fh, limit, 0

    def write(self, b):
        b = bytes(b)
        room = self.limit - self.written
        if len(b) > room:
            self.fh.write(b[:max(room, 0)])
            self.written = self.limit
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += len(b)
        return self.fh.write(b)

    def writable(self):
        return True

    def seekable(self):
        return self.fh.seekable()

    def seek(self, *a):
        return self.fh.seek(*a)

    def tell(self):
        return self.fh.tell()

    def flush(self):
        return self.fh.flush()


def test_a_full_disk_leaves_the_previous_file_and_no_temp_files(tmp_path, monkeypatch):
    old, new = BELIEFS["LoFiBelief"], corpus_beliefs()["FullCov"]
    path = tmp_path / "b.npz"
    rb.save(old, path)
    before = path.read_bytes()
    real_write = rbio._write_arrays
    size_new = Path(rb.save(new, tmp_path / "probe")).stat().st_size
    os.remove(tmp_path / "probe")
    for limit in (0, 11, 100, size_new // 2, size_new - 1):
        monkeypatch.setattr(rbio, "_write_arrays", lambda fh, arrays, n=limit: real_write(FullDisk(fh, n), arrays))
        with pytest.raises(OSError) as info:
            rb.save(new, path)
        assert info.value.errno == errno.ENOSPC
        assert path.read_bytes() == before
        assert sorted(os.listdir(tmp_path)) == ["b.npz"]
        assert same(rb.load(path), old)
    # a first save that fails leaves nothing at all
    with pytest.raises(OSError):
        rb.save(new, tmp_path / "fresh.npz")
    assert sorted(os.listdir(tmp_path)) == ["b.npz"]


@pytest.mark.parametrize("step", ["fsync", "replace", "interrupt"])
def test_a_failure_after_writing_leaves_the_previous_file(tmp_path, monkeypatch, step):
    old, new = BELIEFS["Diag"], BELIEFS["DLR"]
    path = tmp_path / "b.npz"
    rb.save(old, path)
    before = path.read_bytes()

    def fail(*a, **k):
        raise KeyboardInterrupt if step == "interrupt" else OSError(errno.EIO, f"{step} failed")
    if step == "interrupt":
        monkeypatch.setattr(rbio, "_write_arrays", lambda fh, arrays: (fh.write(b"PK\x03\x04partial"), fail()))
    else:
        monkeypatch.setattr(rbio.os, step, fail)
    with pytest.raises(KeyboardInterrupt if step == "interrupt" else OSError):
        rb.save(new, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and same(rb.load(path), old)
    assert sorted(os.listdir(tmp_path)) == ["b.npz"]


# --- a save killed mid-write -----------------------------------------------------------------------------

CHILD = r"""
import sys, time, numpy as np, refbayes as rb
P = int(sys.argv[2])
rng = np.random.default_rng(1)
bel = rb.Diag(rng.standard_normal(P), rng.uniform(1.0, 2.0, P))
sys.stdout.write("ready\n"); sys.stdout.flush()
t0 = time.perf_counter()
rb.save(bel, sys.argv[1])
sys.stdout.write(f"{time.perf_counter() - t0}\n"); sys.stdout.flush()
"""


def run_child(path, P, kill_after=None):
    """Save a P-parameter Diag at ``path`` in a subprocess; SIGKILL it ``kill_after`` s into the save.
    Returns the save's duration in seconds when it was not killed."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(P)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"
        if kill_after is None:
            return float(child.stdout.readline())
        time.sleep(kill_after)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=120)
        child.stdout.close()
    return None


def test_a_save_killed_mid_write_leaves_the_previous_file(tmp_path):
    P = 4_000_000  # 64 MB of arrays: the save takes long enough for the kills to land inside it
    (tmp_path / "calib").mkdir()
    duration = run_child(tmp_path / "calib" / "b.npz", P)  # hashing ~40%, then writing, fsync, rename
    rng = np.random.default_rng(0)
    old = rb.Diag(rng.standard_normal(1000), rng.uniform(1.0, 2.0, 1000))
    delays = [0.0] + [f * duration for f in (0.3, 0.45, 0.6, 0.75, 0.9, 1.2)]
    mid_write = 0
    for i, delay in enumerate(delays):
        workdir = tmp_path / f"kill{i}"
        workdir.mkdir()
        path = workdir / "belief.npz"
        rb.save(old, path)
        before = path.read_bytes()
        run_child(path, P, kill_after=delay)
        leftovers = sorted(set(os.listdir(workdir)) - {"belief.npz"})
        back = rb.load(path)  # never a half-written file
        if leftovers:  # the kill landed while the temporary file was being written
            mid_write += 1
            assert all(name.startswith(".belief.npz.") and name.endswith(".tmp") for name in leftovers)
            assert path.read_bytes() == before and same(back, old)
        else:  # before the temporary file existed (old file) or after the rename (new file, complete)
            assert same(back, old) or back.n_params == P
    assert mid_write >= 2, f"only {mid_write} of {len(delays)} kills (save took {duration:.3f} s) landed mid-write"


# --- the documented format, written without refbayes -------------------------------------------------------

def spec_checksum(arrays):
    """docs/file-format.md §4, written from the page: sha256 over sorted keys' descriptions and raw bytes."""
    import hashlib

    h = hashlib.sha256()
    h.update(b"refbayes belief arrays\0")
    for key in sorted(k for k in arrays if k not in ("__type__", "__version__", "__checksum__")):
        a = arrays[key]
        order = "F" if (a.flags.f_contiguous and not a.flags.c_contiguous) else "C"
        h.update(key.encode() + b"\0" + a.dtype.str.encode() + b"\0" + repr(a.shape).encode() + b"\0"
                 + order.encode() + b"\0")
        h.update(a.tobytes(order="F" if order == "F" else "C"))
    return "sha256:" + h.hexdigest()


def test_a_file_written_from_the_format_page_loads(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"mean": rng.standard_normal(4), "ups": rng.uniform(1, 2, 4),
              "W": np.asfortranarray(rng.standard_normal((4, 2)))}
    path = tmp_path / "by_hand.npz"
    np.savez(path, __type__=np.array("DLR"), __version__=np.array(1),
             __checksum__=np.array(spec_checksum(arrays)), **arrays)
    bel = rb.load(path)
    assert isinstance(bel, rb.DLR)
    for key, value in arrays.items():
        assert same_array(np.asarray(getattr(bel, key)), value) or np.array_equal(getattr(bel, key), value)
    # and the checksum refbayes writes is the one the page defines
    saved = tmp_path / "saved.npz"
    rb.save(bel, saved)
    with np.load(saved, allow_pickle=False) as f:
        stored = {k: f[k] for k in f.files}
    assert str(stored["__checksum__"]) == spec_checksum(stored)
    # a wrong checksum is rejected
    np.savez(path, __type__=np.array("DLR"), __version__=np.array(1),
             __checksum__=np.array("sha256:" + "0" * 64), **arrays)
    assert "checksum" in expect_value_error(path)
