"""Type hints on the public API.

Every public callable reachable from ``refbayes.__all__`` (the top-level functions and
classes, the public functions and classes of the public submodules, and each public
class's ``__init__`` and public methods and properties) annotates every parameter
other than ``self`` / ``cls`` / ``*args`` / ``**kwargs``, and its return. The hints are
strings at run time (``from __future__ import annotations``), so this also checks that
each one resolves with :func:`typing.get_type_hints`: a misspelt or unimported name
would otherwise go unnoticed until a reader (or pdoc) evaluates it.
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import sys
import typing

import pytest

from test_docs import _own, _public_members

# Members whose hint would be misleading, and why. Keep this short.
ALLOWED_MISSING: dict[str, str] = {}

# Modules still being reworked in other changes; their hints are added there. Each entry
# must still have at least one unannotated member: once a module is complete the test
# fails until it is removed from this list, so the list can only shrink.
PENDING_MODULES: tuple[str, ...] = ()


def _public_callables():
    """Yield (qualified name, function) for every public function, method, property getter and
    ``__init__``: the members whose docstrings tests/test_docs.py checks, plus each class's
    constructor."""
    for qual, obj in _public_members():
        if inspect.ismodule(obj):
            continue
        if inspect.isclass(obj):
            init = inspect.getattr_static(obj, "__init__")
            if inspect.isfunction(init) and _own(init):
                yield f"{qual}.__init__", init
            continue
        yield qual, obj


def _module(fn) -> str:
    return inspect.unwrap(fn).__module__


def _pending(fn) -> bool:
    return any(fnmatch.fnmatch(_module(fn), pat) for pat in PENDING_MODULES)


def _missing(fn) -> list[str]:
    """Names of the parameters (and "return") of ``fn`` that carry no annotation."""
    sig = inspect.signature(fn)  # follows functools.wraps to the decorated function
    out = [p.name for p in sig.parameters.values()
           if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
           and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        out.append("return")
    return out


_CACHE: list = []


def _callables():
    if not _CACHE:
        _CACHE.extend(_public_callables())
    return _CACHE


def test_the_walk_reaches_the_public_api():
    """Guard against a walk that silently checks nothing: the core entry points are visited."""
    names = {q for q, _ in _callables()}
    for must in ("refbayes.LoFi.__init__", "refbayes.LoFi.update", "refbayes.FullEKF.scan",
                 "refbayes.FDEKF.predict_obs", "refbayes.FullEKF.with_noise", "refbayes.Diag.sample",
                 "refbayes.save", "refbayes.load", "refbayes.linalg.psd_solve", "refbayes.exact.kalman_filter",
                 "refbayes.predictive.predict_obs", "refbayes.MLP.jacobian", "refbayes.Gaussian.log_prob",
                 "refbayes.tune", "refbayes.golden.compare", "refbayes.verify.run_checks",
                 "refbayes.interchange.to_flax", "refbayes.ScanResult.total_log_evidence"):
        assert must in names, must
    assert len(names) > 300


def test_public_callables_are_annotated():
    missing = {}
    for qual, fn in _callables():
        if _pending(fn):
            continue
        gaps = [g for g in _missing(fn) if f"{qual}:{g}" not in ALLOWED_MISSING]
        if gaps:
            missing[qual] = gaps
    assert not missing, "public callables without type hints (parameter or return):\n" + "\n".join(
        f"  {q} ({_module(fn)}): {missing[q]}" for q, fn in _callables() if q in missing)


def test_allowed_and_pending_lists_only_shrink():
    gaps = {f"{q}:{g}" for q, fn in _callables() for g in _missing(fn)}
    assert not set(ALLOWED_MISSING) - gaps, "now annotated; remove from ALLOWED_MISSING"
    modules = {_module(fn) for q, fn in _callables() if _missing(fn)}
    done = [pat for pat in PENDING_MODULES if not any(fnmatch.fnmatch(m, pat) for m in modules)]
    assert not done, f"these modules are fully annotated now; remove them from PENDING_MODULES: {done}"


def _namespace(module_name: str) -> dict:
    """The module's globals plus the names its ``if TYPE_CHECKING:`` blocks import (as pdoc does)."""
    module = sys.modules[module_name]
    ns = dict(vars(module))
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            code = compile(ast.Module(body=node.body, type_ignores=[]), module.__file__, "exec")
            exec(code, ns)  # noqa: S102 - the module's own import lines
    return ns


def test_hints_resolve():
    """Each hint of an annotated callable evaluates in its module (what pdoc and type checkers do)."""
    bad = {}
    namespaces: dict[str, dict] = {}
    for qual, fn in _callables():
        if _pending(fn):
            continue
        fn = inspect.unwrap(fn)
        if fn.__module__ not in namespaces:
            namespaces[fn.__module__] = _namespace(fn.__module__)
        try:
            typing.get_type_hints(fn, globalns=namespaces[fn.__module__])
        except Exception as exc:  # noqa: BLE001 - report every failure with its cause
            bad[qual] = f"{type(exc).__name__}: {exc}"
    assert not bad, bad


@pytest.mark.parametrize("module", ["beliefs", "models", "likelihoods", "io", "results", "exact", "predictive",
                                    "linalg", "interchange", "tune", "golden", "verify", "estimator", "memory",
                                    "filters.base", "filters.ekf", "filters.diagonal", "filters.lofi",
                                    "filters.subspace", "filters.replay", "filters.rvga", "filters.logistic",
                                    "filters.bong.filter", "bandits.agents", "bandits.environments",
                                    "bandits.memory", "bandits.reward_model", "bandits.run", "parallel", "errors"])
def test_annotations_are_not_evaluated_at_import(module):
    """``from __future__ import annotations``: hints stay strings, so they cost nothing at import."""
    import __future__
    import importlib

    mod = importlib.import_module(f"refbayes.{module}")
    assert getattr(mod, "annotations", None) is __future__.annotations, module
