"""The whole LO-FI step on the GPU (``backend="cuda"``, belief on the device) against the Numba backend
on the same machine, in one run (docs/gpu.md).

Workloads (Gaussian likelihood, C = 10 outputs, rank 10, q = 1e-6 so that the predict step is not
trivial): the linear model h = reshape(theta, (C, P / C)) x (``rb.Linear(P / C, C, bias=False)``) at
P = 1e5, 1e6, 1e7, and the tanh MLPs 100-1000-1000-10 (P = 1,112,010) and 1000-3000-3000-10
(P = 12,036,010); quick: P = 1e5, 1e6 and the first MLP. Each is ``predict_update`` of ``rb.LoFi``
per observation after three warm-up steps (compilation, a full-rank W); the time is the median
(and the minimum) over the timed steps, waiting for the GPU at the end of each step. The NumPy
reference (``backend="numpy"``) is timed too, two steps after one, up to P = 1.2e6, for the ratio to
the reference in the same run.

FD-EKF (float64) is timed too, its GPU chain (``kernels.cuda.diag_step``) against the Numba step, with
6 P numbers moved per step (``fd_step_bytes``), and so is spherical LO-FI (float64; the diagonal chain
with the discarded directions dropped, the same bytes as the diagonal step). Both dtypes of LO-FI are
timed: float64, and float32 beliefs (``dtype=np.float32``: stored in float32, computed in float64) on
the GPU and on the Numba backend, from the same start and on the same observations; the float32 run's
final mean is compared with the float64 run's.

Bytes that a step must move on the device (the model of the kernels, docs/gpu.md §3): pass 1 reads
W and ups, pass 2 reads W, ups and mu and writes W', mu' and ups', the forward and reverse passes
read the weights: s P (2 L + rank + 6) + s P for s bytes per number (8 for float64, 4 for float32).
The floor is those bytes over a device-to-device copy bandwidth measured here (bytes read plus
written); the report gives each step's multiple of it.
Returns a summary with ``checks`` (the issue's targets, each met or not) and writes bench_gpu.json.
"""

import json
import os
import platform
import time

import numpy as np

from .common import check

__all__ = ["run", "device_copy_bandwidth", "step_bytes", "fd_step_bytes"]

RANK = 10
C = 10
Q = 1e-6
N_TIMED = (10, 20)  # GPU steps timed per workload (quick, full)
WARM = 3  # untimed steps first (compilation, a full-rank W)
NUMPY_MAX = 1_200_000  # the NumPy reference is timed up to here (2 steps; seconds each at P = 1e6)
# targets on an H100 (float64, whole step): linear model at P = 1e6, 1e7; the two MLPs
TARGETS_MS = {("linear", 10**6): 1.4, ("linear", 10**7): 9.0, ("mlp", 1_112_010): 1.7, ("mlp", 12_036_010): 11.0}
# float32: a third of the JAX float32 step on an H100 (probml/rebayes' LO-FI; issue figures)
TARGETS32_MS = {("linear", 10**6): 2.62 / 3, ("linear", 10**7): 21.0 / 3, ("mlp", 1_112_010): 4.40 / 3,
                ("mlp", 12_036_010): 23.8 / 3}


def _gpu():
    """numba.cuda when a real GPU is present (not the simulator), else None."""
    try:
        from numba import config as nconfig

        if nconfig.ENABLE_CUDASIM:
            return None
        from numba import cuda

        return cuda if cuda.is_available() else None
    except Exception:  # no driver or toolkit
        return None


def device_copy_bandwidth(cuda, nbytes=1 << 30, reps=10):
    """Bytes per second (read + written) of a device-to-device copy of ``nbytes``: the best of ``reps``."""
    n = nbytes // 8
    a = cuda.device_array(n)
    b = cuda.device_array(n)
    b.copy_to_device(a)
    cuda.synchronize()
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_to_device(a)
        cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * 8 * n / best


def step_bytes(model, rank=RANK, L=RANK, itemsize=8):
    """Bytes a GPU step must move with ``itemsize`` bytes per stored number (8: float64, 4: float32):
    itemsize P (2 L + rank + 6) plus the weights read by the forward and reverse passes (docs/gpu.md §3)."""
    P = model.n_params
    return itemsize * P * (2 * L + rank + 6) + itemsize * P


def fd_step_bytes(model, itemsize=8):
    """Bytes a GPU FD-EKF step must move (kernels.cuda.diag_step): the per-unit sums read var, the forward
    and reverse passes the weights, the row kernel reads mean and var and writes them: 6 itemsize P."""
    return 6 * itemsize * model.n_params


def _steps(filt, bel, X, Y, sync):
    times = []
    for t in range(X.shape[0]):
        t0 = time.perf_counter()
        bel = filt.predict_update(bel, X[t], Y[t])
        sync()
        times.append(time.perf_counter() - t0)
    return bel, np.array(times)


def _timed(filt, X, Y, m0, backend, cuda, n_timed):
    """(belief, timing record, the timed steps' slice of X) of ``filt`` (built for ``backend``) from
    N(m0, 0.1 I): untimed warm-up steps (one for the NumPy reference), then timed steps, waiting for the GPU
    at the end of each."""
    sync = cuda.synchronize if backend == "cuda" else (lambda: None)
    warm = 1 if backend == "numpy" else WARM
    bel, _ = _steps(filt, filt.init(m0, 0.1), X[:warm], Y[:warm], sync)
    nt = {"cuda": n_timed, "numba": max(3, n_timed // 4), "numpy": 2}[backend]
    timed = slice(warm, warm + nt)
    bel, t = _steps(filt, bel, X[timed], Y[timed], sync)
    record = {"median_s": float(np.median(t)), "min_s": float(t.min()), "steps": int(nt),
              "device_resident": type(bel).__name__.startswith("Device"), "dtype": str(bel.dtype)}
    return bel, record, timed


def _cuda_against_numba(make, X, Y, m0, cuda, n_timed, nbytes, bw):
    """{"cuda", "numba": timing records, "numba_over_cuda", "bytes_per_step", "multiple_of_floor"} of the filter
    ``make(backend)`` builds, timed on both backends (float64; ``nbytes`` moved per step, ``bw`` the copy
    bandwidth)."""
    out = {}
    for backend in ("cuda", "numba"):
        filt = make(backend)
        bel, out[backend], _ = _timed(filt, X, Y, m0, backend, cuda, n_timed)
        del bel, filt
    out["numba_over_cuda"] = out["numba"]["median_s"] / out["cuda"]["median_s"]
    out["bytes_per_step"] = nbytes
    out["multiple_of_floor"] = out["cuda"]["median_s"] / (nbytes / bw)
    return out


def _phases(filt, bel, X, Y):
    """Milliseconds per step of each phase of the GPU step (kernels.cuda.step.PROFILE: the GPU is waited
    for at the end of each phase, so the sum exceeds the step time a little)."""
    from refbayes.kernels.cuda import step

    step.PROFILE = {}
    try:
        for t in range(X.shape[0]):
            bel = filt.predict_update(bel, X[t], Y[t])
        prof = {k: 1e3 * v / X.shape[0] for k, v in step.PROFILE.items() if not k.startswith("_")}
        prof["new allocations per step"] = step.PROFILE.get("_pool_misses", 0) / X.shape[0]
    finally:
        step.PROFILE = None
    return prof


def _workloads(quick):
    import refbayes as rb

    out = [("linear", rb.Linear(P // C, C, bias=False)) for P in ((10**5, 10**6) if quick else (10**5, 10**6, 10**7))]
    out.append(("mlp", rb.MLP([100, 1000, 1000, 10])))
    if not quick:
        out.append(("mlp", rb.MLP([1000, 3000, 3000, 10])))
    return out


def run(quick=False, outdir="."):
    """Time the GPU and Numba LO-FI steps on each workload, in float64 and float32; write bench_gpu.json
    into ``outdir``."""
    import numba

    import refbayes as rb

    cuda = _gpu()
    os.makedirs(outdir, exist_ok=True)
    if cuda is None:
        summary = {"skipped": "no NVIDIA GPU (or only the CUDA simulator): nothing timed", "checks": []}
        with open(os.path.join(outdir, "bench_gpu.json"), "w") as fh:
            json.dump(summary, fh, indent=2)
        return summary
    name = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    bw = device_copy_bandwidth(cuda)
    rng = np.random.default_rng(0)
    rows = []
    n_timed = N_TIMED[0] if quick else N_TIMED[1]
    for kind, model in _workloads(quick):
        P = model.n_params
        lik = rb.Gaussian(1.0)
        X = rng.standard_normal((WARM + n_timed, model.in_dim)) / np.sqrt(model.in_dim)
        Y = rng.standard_normal((WARM + n_timed, C))
        m0 = rng.standard_normal(P) / np.sqrt(model.in_dim)
        row = {"workload": kind, "P": P, "layers": list(getattr(model, "layer_sizes", [model.in_dim, C]))}
        runs = [("cuda", "float64"), ("numba", "float64")] + ([("numpy", "float64")] if P <= NUMPY_MAX else [])
        runs += [("cuda", "float32"), ("numba", "float32")]
        means = {}
        for backend, dt in runs:
            filt = rb.LoFi(model, lik, rank=RANK, q=Q, backend=backend, dtype=np.dtype(dt))
            bel, record, timed = _timed(filt, X, Y, m0, backend, cuda, n_timed)
            key = backend if dt == "float64" else backend + "_f32"
            row[key] = record
            if backend == "cuda":
                # as many steps as were timed: the first steps after the warm-up may still allocate
                # (the pool of recycled arrays fills over two steps), and three steps made that look per-step
                row[key]["phases_ms"] = _phases(filt, bel, X[timed], Y[timed])
                means[dt] = bel.mean  # after the same steps in both dtypes
            del bel, filt
        row["f32_mean_rel_diff"] = float(np.linalg.norm(means["float32"].astype(np.float64) - means["float64"])
                                         / np.linalg.norm(means["float64"]))
        for dt, sfx, size in (("float64", "", 8), ("float32", "_f32", 4)):
            nbytes = step_bytes(model, itemsize=size)
            row["bytes_per_step" + sfx] = nbytes
            row["floor_s" + sfx] = nbytes / bw
            row["multiple_of_floor" + sfx] = row["cuda" + sfx]["median_s"] / row["floor_s" + sfx]
            row["numba_over_cuda" + sfx] = row["numba" + sfx]["median_s"] / row["cuda" + sfx]["median_s"]
            if "numpy" in row:
                row["numpy_over_cuda" + sfx] = row["numpy"]["median_s"] / row["cuda" + sfx]["median_s"]
        # FD-EKF (float64), the diagonal chain of kernels (kernels.cuda.diag_step), and spherical LO-FI (float64),
        # the diagonal chain with the discarded directions dropped (docs/gpu.md §4), each against the Numba step
        row["fdekf"] = fd = _cuda_against_numba(lambda b: rb.FDEKF(model, lik, q=Q, backend=b), X, Y, m0, cuda,
                                                n_timed, fd_step_bytes(model), bw)
        row["spherical"] = sp = _cuda_against_numba(
            lambda b: rb.LoFi(model, lik, rank=RANK, q=Q, variant="spherical", backend=b), X, Y, m0, cuda, n_timed,
            step_bytes(model), bw)
        rows.append(row)
        for what, r in (("FD-EKF", fd), ("spherical LO-FI", sp)):
            print(f"[bench_gpu] {kind} P = {P:,} {what} float64: cuda {1e3 * r['cuda']['median_s']:.2f} ms, numba "
                  f"{1e3 * r['numba']['median_s']:.2f} ms ({r['multiple_of_floor']:.1f}x the copy floor)", flush=True)
        for sfx in ("", "_f32"):
            print(f"[bench_gpu] {kind} P = {P:,} {'float32' if sfx else 'float64'}: cuda "
                  f"{1e3 * row['cuda' + sfx]['median_s']:.2f} ms, numba {1e3 * row['numba' + sfx]['median_s']:.2f} ms;"
                  " phases (ms) " + ", ".join(f"{k} {v:.3f}" for k, v in row["cuda" + sfx]["phases_ms"].items()),
                  flush=True)

    checks = []
    for r in rows:
        for dt, sfx, targets in (("float64", "", TARGETS_MS), ("float32", "_f32", TARGETS32_MS)):
            ms = 1e3 * r["cuda" + sfx]["median_s"]
            what = f"{r['workload']}, P = {r['P']:,}, {dt}"
            checks.append(check(f"GPU step faster than numba on this machine: {what}", "numba / cuda > 1",
                                f"{r['numba_over_cuda' + sfx]:.1f}x ({ms:.2f} ms vs "
                                f"{1e3 * r['numba' + sfx]['median_s']:.2f} ms)", r["numba_over_cuda" + sfx] > 1.0))
            target = targets.get((r["workload"], r["P"]))
            if target is not None:
                checks.append(check(f"target (H100, a third of JAX's {dt} step): whole GPU step, {what}",
                                    f"<= {target:.2f} ms", f"{ms:.2f} ms on {name}", ms <= target))
            if r["P"] >= 10**7:
                checks.append(check(f"GPU step within 3x of the copy-bandwidth floor: {what}", "<= 3x",
                                    f"{r['multiple_of_floor' + sfx]:.1f}x ({r['bytes_per_step' + sfx] / 1e9:.2f} GB "
                                    f"at {bw / 1e12:.2f} TB/s: floor {1e3 * r['floor_s' + sfx]:.2f} ms)",
                                    r["multiple_of_floor" + sfx] <= 3.0))
        for what, key in (("FD-EKF", "fdekf"), ("spherical LO-FI", "spherical")):
            c = r[key]
            checks.append(check(f"{what} GPU step faster than numba on this machine: {r['workload']}, P = {r['P']:,}",
                                "numba / cuda > 1", f"{c['numba_over_cuda']:.1f}x ({1e3 * c['cuda']['median_s']:.2f} "
                                f"ms vs {1e3 * c['numba']['median_s']:.2f} ms; {c['multiple_of_floor']:.1f}x the copy "
                                "floor)", c["numba_over_cuda"] > 1.0))
        checks.append(check(f"float32 GPU run follows the float64 one: {r['workload']}, P = {r['P']:,}",
                            "final means within 1e-4 (relative, 2-norm)", f"{r['f32_mean_rel_diff']:.1e}",
                            r["f32_mean_rel_diff"] < 1e-4))
    table = {"header": ["workload", "P", "dtype", "cuda ms (median)", "numba ms (median)", "numba / cuda",
                        "NumPy reference ms", "NumPy / cuda", "GB per step", "floor ms", "x floor"],
             "rows": [[r["workload"] + " " + "-".join(map(str, r["layers"])), f"{r['P']:,}", dt,
                       f"{1e3 * r['cuda' + sfx]['median_s']:.2f}", f"{1e3 * r['numba' + sfx]['median_s']:.2f}",
                       f"{r['numba_over_cuda' + sfx]:.1f}",
                       f"{1e3 * r['numpy']['median_s']:.1f}" if "numpy" in r else "not timed",
                       f"{r['numpy_over_cuda' + sfx]:.0f}" if "numpy" in r else "-",
                       f"{r['bytes_per_step' + sfx] / 1e9:.3f}", f"{1e3 * r['floor_s' + sfx]:.3f}",
                       f"{r['multiple_of_floor' + sfx]:.1f}"]
                      for r in rows for dt, sfx in (("float64", ""), ("float32", "_f32"))]}
    summary = {
        "table": table,
        "machine": {"gpu": name, "platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "numba_threads": numba.get_num_threads(), "numba": numba.__version__,
                    "numpy": np.__version__},
        "copy_bandwidth_Bps": bw,
        "rank": RANK, "C": C, "q": Q,
        "rows": rows,
        "checks": checks,
    }
    with open(os.path.join(outdir, "bench_gpu.json"), "w") as fh:
        json.dump(summary, fh, indent=2, default=float)
    return summary
