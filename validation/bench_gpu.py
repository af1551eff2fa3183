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

Bytes that a step must move on the device (the model of the kernels, docs/gpu.md §3): pass 1 reads
W and ups, pass 2 reads W, ups and mu and writes W', mu' and ups', the forward and reverse passes
read the weights: 8 P (2 L + rank + 6) for float64. The floor is those bytes over a device-to-device
copy bandwidth measured here (bytes read plus written); the report gives each step's multiple of it.

Only float64 is timed: the float32 step is not implemented (the check says so).
Returns a summary with ``checks`` (the issue's targets, each met or not) and writes bench_gpu.json.
"""

import json
import os
import platform
import time

import numpy as np

from .common import check

__all__ = ["run", "device_copy_bandwidth", "step_bytes"]

RANK = 10
C = 10
Q = 1e-6
N_TIMED = (10, 20)  # GPU steps timed per workload (quick, full)
NUMPY_MAX = 1_200_000  # the NumPy reference is timed up to here (2 steps; seconds each at P = 1e6)
# targets on an H100 (float64, whole step): linear model at P = 1e6, 1e7; the two MLPs
TARGETS_MS = {("linear", 10**6): 1.4, ("linear", 10**7): 9.0, ("mlp", 1_112_010): 1.7, ("mlp", 12_036_010): 11.0}


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


def step_bytes(model, rank=RANK, L=RANK):
    """Bytes a float64 GPU step must move: 8 P (2 L + rank + 6) plus the weights read by the forward and
    reverse passes (docs/gpu.md §3)."""
    P = model.n_params
    return 8 * P * (2 * L + rank + 6) + 8 * P


def _steps(filt, bel, X, Y, sync):
    times = []
    for t in range(X.shape[0]):
        t0 = time.perf_counter()
        bel = filt.predict_update(bel, X[t], Y[t])
        sync()
        times.append(time.perf_counter() - t0)
    return bel, np.array(times)


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
    """Time the GPU and Numba LO-FI steps on each workload; write bench_gpu.json into ``outdir``."""
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
        X = rng.standard_normal((3 + n_timed, model.in_dim)) / np.sqrt(model.in_dim)
        Y = rng.standard_normal((3 + n_timed, C))
        m0 = rng.standard_normal(P) / np.sqrt(model.in_dim)
        row = {"workload": kind, "P": P, "layers": list(getattr(model, "layer_sizes", [model.in_dim, C]))}
        for backend in ("cuda", "numba") + (("numpy",) if P <= NUMPY_MAX else ()):
            filt = rb.LoFi(model, lik, rank=RANK, q=Q, backend=backend)
            bel = filt.init(m0, 0.1)
            sync = cuda.synchronize if backend == "cuda" else (lambda: None)
            warm = 1 if backend == "numpy" else 3
            bel, _ = _steps(filt, bel, X[:warm], Y[:warm], sync)
            nt = {"cuda": n_timed, "numba": max(3, n_timed // 4), "numpy": 2}[backend]
            bel, t = _steps(filt, bel, X[3:3 + nt], Y[3:3 + nt], sync)
            row[backend] = {"median_s": float(np.median(t)), "min_s": float(t.min()), "steps": int(nt),
                            "device_resident": type(bel).__name__ == "DeviceDLR"}
            if backend == "cuda":
                # as many steps as were timed: the first steps after the warm-up may still allocate
                # (the pool of recycled arrays fills over two steps), and three steps made that look per-step
                row["cuda"]["phases_ms"] = _phases(filt, bel, X[3:3 + nt], Y[3:3 + nt])
            del bel, filt
        nbytes = step_bytes(model)
        row["bytes_per_step"] = nbytes
        row["floor_s"] = nbytes / bw
        row["multiple_of_floor"] = row["cuda"]["median_s"] / row["floor_s"]
        row["numba_over_cuda"] = row["numba"]["median_s"] / row["cuda"]["median_s"]
        if "numpy" in row:
            row["numpy_over_cuda"] = row["numpy"]["median_s"] / row["cuda"]["median_s"]
        rows.append(row)
        print(f"[bench_gpu] {kind} P = {P:,}: cuda {1e3 * row['cuda']['median_s']:.2f} ms, numba "
              f"{1e3 * row['numba']['median_s']:.2f} ms; phases (ms) "
              + ", ".join(f"{k} {v:.3f}" for k, v in row["cuda"]["phases_ms"].items()), flush=True)

    checks = []
    for r in rows:
        ms = 1e3 * r["cuda"]["median_s"]
        checks.append(check(f"GPU step faster than numba on this machine: {r['workload']}, P = {r['P']:,}",
                            "numba / cuda > 1", f"{r['numba_over_cuda']:.1f}x ({ms:.2f} ms vs "
                            f"{1e3 * r['numba']['median_s']:.2f} ms)", r["numba_over_cuda"] > 1.0))
        target = TARGETS_MS.get((r["workload"], r["P"]))
        if target is not None:
            checks.append(check(f"target (H100, float64): whole GPU step, {r['workload']}, P = {r['P']:,}",
                                f"<= {target} ms", f"{ms:.2f} ms on {name}", ms <= target))
        if r["P"] >= 10**7:
            checks.append(check(f"GPU step within 3x of the copy-bandwidth floor: {r['workload']}, P = {r['P']:,}",
                                "<= 3x", f"{r['multiple_of_floor']:.1f}x ({r['bytes_per_step'] / 1e9:.2f} GB at "
                                f"{bw / 1e12:.2f} TB/s: floor {1e3 * r['floor_s']:.2f} ms)",
                                r["multiple_of_floor"] <= 3.0))
    checks.append(check("float32 GPU step", "timed against float64", "not implemented (float64 only)", False))
    table = {"header": ["workload", "P", "cuda ms (median)", "numba ms (median)", "numba / cuda",
                        "NumPy reference ms", "NumPy / cuda", "GB per step", "floor ms", "x floor"],
             "rows": [[r["workload"] + " " + "-".join(map(str, r["layers"])), f"{r['P']:,}",
                       f"{1e3 * r['cuda']['median_s']:.2f}", f"{1e3 * r['numba']['median_s']:.2f}",
                       f"{r['numba_over_cuda']:.1f}",
                       f"{1e3 * r['numpy']['median_s']:.1f}" if "numpy" in r else "not timed",
                       f"{r['numpy_over_cuda']:.0f}" if "numpy" in r else "-",
                       f"{r['bytes_per_step'] / 1e9:.3f}", f"{1e3 * r['floor_s']:.3f}",
                       f"{r['multiple_of_floor']:.1f}"] for r in rows]}
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
