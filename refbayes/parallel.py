"""Independent trials (validation sweeps, hyper-parameter grids), in parallel where dask is installed.

A trial is ``fn(key)`` for a hashable, printable key (a seed, a split, a (method, alpha) pair)
and returns a picklable result. Each trial draws its randomness from ``trial_rng(key)``, a
generator seeded by a hash of the key alone, so the results do not depend on the number of
workers, on their order, or on which trials ran before.

``run_trials`` runs the trials in this process (the default, and whenever dask is missing),
on a local dask cluster of ``workers`` processes, or on an existing dask scheduler at
``scheduler``. A trial that raises, or whose worker dies more often than dask's retry
allowance, is returned as a :class:`TrialFailure` naming its key and error: never dropped.

``configure(workers=..., scheduler=...)`` sets the defaults that ``refbayes validate
--workers N --scheduler ADDRESS`` passes to every experiment (and ``refbayes tune`` to its grid).
"""

from __future__ import annotations

import hashlib
import sys
import time
import traceback
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TrialFailure", "run_trials", "trial_rng", "trial_seed", "configure", "settings"]

_SETTINGS = {"workers": None, "scheduler": None, "progress": False}


def configure(workers: int | None = None, scheduler: str | None = None, progress: bool = False) -> None:
    """Defaults for ``run_trials``: the number of local worker processes, or a scheduler address."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer; got {workers!r}")
    _SETTINGS.update(workers=workers, scheduler=scheduler, progress=bool(progress))


def settings() -> dict[str, Any]:
    """The current defaults (a copy)."""
    return dict(_SETTINGS)


@dataclass(frozen=True)
class TrialFailure:
    """A trial that did not return: its key and the error (type, message, traceback text)."""

    key: object
    error: str

    def __bool__(self):
        return False


def trial_seed(key: Hashable) -> int:
    """A 63-bit seed from the key's repr alone (stable across processes and Python runs)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def trial_rng(key: Hashable) -> np.random.Generator:
    """The trial's own random generator: ``np.random.default_rng(trial_seed(key))``."""
    return np.random.default_rng(trial_seed(key))


def _call(fn, key):
    try:
        return fn(key)
    except Exception as exc:  # recorded and reported, never dropped
        return TrialFailure(key, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")


def _dask_client(workers, scheduler):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        return None, None
    if scheduler:
        return Client(scheduler), None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    return Client(cluster), cluster


def run_trials(fn: Callable[[Any], Any], keys: Iterable[Hashable], *, workers: int | None = None,
               scheduler: str | None = None, label: str = "trials",
               progress: bool | None = None) -> dict[Any, Any]:
    """Run ``fn(key)`` for every key; returns {key: result or TrialFailure}, in the order of ``keys``.

    workers: local dask worker processes (None: the ``configure`` default; 1 or no dask: in
    this process); scheduler: a dask scheduler address (overrides workers); label, progress:
    one line per finished trial on stderr.
    """
    keys = list(keys)
    if len(set(map(repr, keys))) != len(keys):
        raise ValueError(f"trial keys must be distinct; got {keys!r}")
    workers = _SETTINGS["workers"] if workers is None else workers
    scheduler = _SETTINGS["scheduler"] if scheduler is None else scheduler
    progress = _SETTINGS["progress"] if progress is None else progress
    start = time.perf_counter()

    def report(done, key, res):
        if progress:
            state = "failed" if isinstance(res, TrialFailure) else "done"
            print(f"[{label}] {done}/{len(keys)} {key!r} {state} ({time.perf_counter() - start:.1f} s)",
                  file=sys.stderr, flush=True)

    client = cluster = None
    if scheduler or (workers or 1) > 1:
        client, cluster = _dask_client(workers or 1, scheduler)
    if client is None:
        out = {}
        for i, key in enumerate(keys):
            out[repr(key)] = _call(fn, key)
            report(i + 1, key, out[repr(key)])
        return {key: out[repr(key)] for key in keys}
    try:
        from distributed import as_completed

        futures = {client.submit(_call, fn, key, pure=False, key=f"{label}-{trial_seed(key)}"): key for key in keys}
        out = {}
        for i, fut in enumerate(as_completed(futures)):
            key = futures[fut]
            try:
                out[repr(key)] = fut.result()
            except Exception as exc:  # the worker died (KilledWorker) or the task was lost
                out[repr(key)] = TrialFailure(key, f"{type(exc).__name__}: {exc}")
            report(i + 1, key, out[repr(key)])
        return {key: out[repr(key)] for key in keys}
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _demo_trial(key):
    """A small deterministic trial for tests and docs: the mean of 1000 draws of the key's generator.

    Keys ("die", n) end their worker process; keys ("raise", n) raise ValueError.
    """
    if isinstance(key, tuple) and key[0] == "die":
        import os

        os._exit(3)
    if isinstance(key, tuple) and key[0] == "raise":
        raise ValueError(f"trial {key!r} failed on purpose")
    return float(trial_rng(key).standard_normal(1000).mean())
