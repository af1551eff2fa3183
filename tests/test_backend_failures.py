"""A step that fails raises the same error on every backend: an overflow is a DivergenceError, a variance
pushed to or below zero a NotPositiveDefiniteError, and neither is ever a ValueError about an internal
array (a ValueError means bad input). BLR and BBB name the inner iteration where they fail, the same way
on every route."""

import re
import textwrap
import warnings

import numpy as np
import pytest

import refbayes as rb
from _cuda_helpers import assert_script_prints
from refbayes.errors import DivergenceError, NotPositiveDefiniteError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's overflow warnings before the errors

MODEL = rb.MLP([2, 3, 1], activation="tanh")

# (observation variance, target, prior variance): from a large residual against a huge prior to a tiny
# noise variance whose R^{-1} overflows the whitened Jacobian
SETUPS = [(1.0, 1e3, 1e10), (1e-300, 1e300, 1e300), (1e-200, 1e200, 1e200), (1.0, 1e200, 1e300)]
LR = {"bong": 1.0, "blr": 1.0, "bog": 1e305, "bbb": 1e305}


def _filters():
    yield "LoFi", lambda lik, b: rb.LoFi(MODEL, lik, rank=2, backend=b)
    yield "FDEKF", lambda lik, b: rb.FDEKF(MODEL, lik, backend=b)
    for rule in ("paper", "ekf"):
        yield f"VDEKF-{rule}", lambda lik, b, rule=rule: rb.VDEKF(MODEL, lik, vd_mean=rule, backend=b)
    for form in ("covariance", "joseph"):
        yield f"FullEKF-{form}", lambda lik, b, form=form: rb.FullEKF(MODEL, lik, form=form, backend=b)
    for alg in ("bong", "blr", "bog", "bbb"):
        for fam in ("diag", "diag-moment", "dlr", "full", "full-moment"):
            if fam.startswith("full") and alg in ("blr", "bbb"):
                continue  # no compiled step: the numba backend refuses them at construction
            for est in ("lin-hess", "lin-ef"):
                yield f"{alg}-{fam}-{est}", lambda lik, b, alg=alg, fam=fam, est=est: rb.Bong(
                    MODEL, lik, algorithm=alg, family=fam, estimator=est, rank=2, lr=LR[alg],
                    n_iter=1 if alg in ("bong", "bog") else 2, backend=b)


FILTERS = dict(_filters())


def _outcome(make, lik, backend, prior_var, y):
    filt = make(lik, backend)
    bel = filt.init(MODEL.init_params(np.random.default_rng(0)), prior_var)
    try:
        filt.predict_update(bel, np.ones(2), np.array([y]))
    except Exception as exc:  # noqa: BLE001 - the type is what the test compares
        return exc
    return None


@pytest.mark.parametrize("setup", SETUPS, ids=[f"r{s[0]:g}-y{s[1]:g}-v{s[2]:g}" for s in SETUPS])
@pytest.mark.parametrize("name", list(FILTERS))
def test_a_failing_step_raises_the_same_named_error_on_numpy_and_numba(name, setup):
    obs_var, y, prior_var = setup
    lik = rb.Gaussian(obs_var)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank 2 of a 13-parameter model, huge values: not the point here
        ref = _outcome(FILTERS[name], lik, "numpy", prior_var, y)
        fast = _outcome(FILTERS[name], lik, "numba", prior_var, y)
    assert ref is None or isinstance(ref, (DivergenceError, NotPositiveDefiniteError)), repr(ref)
    assert type(fast) is type(ref), f"numpy: {ref!r}; numba: {fast!r}"
    if isinstance(ref, DivergenceError):
        assert ref.quantity and fast.quantity


@pytest.mark.parametrize("estimator", ["lin-hess", "lin-ef"])
def test_a_bbb_dlr_step_that_makes_ups_negative_names_the_entry_in_the_references_words(estimator):
    # the compiled DLR BBB routes (per-unit and dense) check ups+ > 0 in their output pass; their message is
    # the reference's (dlr_belief), word for word up to the last digits of the value, inner iteration included
    model = rb.MLP([5, 8, 3], activation="tanh")
    rng = np.random.default_rng(0)
    theta = model.init_params(rng)
    x = rng.standard_normal(5)
    messages = {}
    for backend in ("numpy", "numba"):
        filt = rb.Bong(model, rb.Categorical(3), algorithm="bbb", family="dlr", rank=3, estimator=estimator, lr=1e3,
                       n_iter=3, backend=backend)
        with pytest.raises(NotPositiveDefiniteError) as err:
            filt.predict_update(filt.init(theta, 1.0), x, 1)
        messages[backend] = re.sub(r"\(-?[0-9.e+-]+\)", "(v)", str(err.value))
    assert messages["numba"] == messages["numpy"]
    assert re.fullmatch(r"BBB \(DLR\) precision update made diagonal entry \d+ non-positive \(v\) "
                        r"\(inner iteration \d of 3\)", messages["numpy"]), messages["numpy"]


ROBUST = {"VDEKF-ekf", "FullEKF-covariance"}  # their updates stay finite and positive in every setup here


def test_every_filter_fails_in_some_setup():
    # the setups reach the failures above: each filter's reference fails in at least one of them, except
    # the two whose updates stay finite here (the exact EKF gain from a diagonal or a full covariance)
    fails = {name: 0 for name in FILTERS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, make in FILTERS.items():
            for obs_var, y, prior_var in SETUPS:
                fails[name] += _outcome(make, rb.Gaussian(obs_var), "numpy", prior_var, y) is not None
    assert {n for n, k in fails.items() if not k} == ROBUST


# MC-EF: the compiled steps over "diag", "diag-moment" and "dlr" draw as the reference does (the same
# Generator seed), so the same draws fail. One ordering differs, by design (docs/streams.md §2): over "diag"
# with a residual of 1e200 against a prior variance of 1e300 the compiled reverse pass forms w * residual
# before tanh' = 0 (inf * 0 = NaN: the estimate is not finite) where the reference forms the Jacobian
# first and stops one line later at a precision of 0.0; both are named errors.
MC_SETUPS = SETUPS + [(1.0, 1e150, 1.0)]
REVERSE_PASS_ORDER = (1.0, 1e200, 1e300)


def _mc_outcome(algorithm, family, lik, backend, prior_var, y, antithetic, estimator="mc-ef", **extra):
    f = rb.Bong(MODEL, lik, algorithm=algorithm, family=family, estimator=estimator, rank=2, lr=LR[algorithm],
                n_iter=1 if algorithm in ("bong", "bog") else 2, n_samples=4, antithetic=antithetic, backend=backend,
                **extra)
    bel = f.init(MODEL.init_params(np.random.default_rng(0)), prior_var)
    try:
        f.predict_update(bel, np.ones(2), np.array([y]), rng=np.random.default_rng(3))
    except Exception as exc:  # noqa: BLE001 - the type is what the test compares
        return exc
    return None


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("family", ["diag", "diag-moment", "dlr"])
@pytest.mark.parametrize("algorithm", ["bong", "blr", "bog", "bbb"])
def test_a_failing_mc_ef_step_raises_the_same_named_error_on_numpy_and_numba(algorithm, family, antithetic):
    failed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obs_var, y, prior_var in MC_SETUPS:
            lik = rb.Gaussian(obs_var)
            ref = _mc_outcome(algorithm, family, lik, "numpy", prior_var, y, antithetic)
            fast = _mc_outcome(algorithm, family, lik, "numba", prior_var, y, antithetic)
            named = (DivergenceError, NotPositiveDefiniteError)
            assert ref is None or isinstance(ref, named), repr(ref)
            if family == "diag" and (obs_var, y, prior_var) == REVERSE_PASS_ORDER and ref is not None:
                assert isinstance(fast, named), repr(fast)
            else:
                assert type(fast) is type(ref), f"{(obs_var, y, prior_var)}: numpy {ref!r}; numba {fast!r}"
            failed += ref is not None
    assert failed >= 3  # the setups reach the failures


# MC-HESS over "diag" and "diag-moment" (Hutchinson's diagonal): the compiled step draws the parameters and
# the probes as the reference does, so the same draws fail. One setup differs, as docs/bong.md §6 says:
# draws with prior variance 1e10 put tanh units far past |a| = 710, where autograd's second derivative of
# tanh, d/da (g / cosh(a)^2), is inf / inf = NaN, so the reference's estimate is not finite
# (DivergenceError), where the exact product (tanh'' = -2 tanh (1 - tanh^2) = 0 there) is finite
TANH_SATURATED = (1.0, 1e3, 1e10)


@pytest.mark.parametrize("family", ["diag", "diag-moment"])
@pytest.mark.parametrize("algorithm", ["bong", "blr", "bog", "bbb"])
def test_a_failing_mc_hess_step_raises_the_same_named_error_on_numpy_and_numba(algorithm, family):
    failed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obs_var, y, prior_var in MC_SETUPS:
            lik = rb.Gaussian(obs_var)
            ref, fast = (_mc_outcome(algorithm, family, lik, backend, prior_var, y, False, "mc-hess", n_probes=3)
                         for backend in ("numpy", "numba"))
            named = (DivergenceError, NotPositiveDefiniteError)
            assert ref is None or isinstance(ref, named), repr(ref)
            if (obs_var, y, prior_var) == TANH_SATURATED:
                assert isinstance(ref, DivergenceError) and "estimate is not finite" in str(ref), repr(ref)
                assert fast is None or isinstance(fast, named), repr(fast)
            else:
                assert type(fast) is type(ref), f"{(obs_var, y, prior_var)}: numpy {ref!r}; numba {fast!r}"
            failed += ref is not None
    assert failed >= 2


# (algorithm, family, lr, prior variance, target): BBB cases that fail after their first inner iteration,
# BLR ones (lr <= 1 for its DLR step) that fail in it
ITERATED = [("bbb", "diag", 1e-3, 100.0, 3.0), ("bbb", "diag-moment", 1e-3, 1.0, 30.0), ("bbb", "dlr", 0.3, 100.0, 3.0),
            ("blr", "diag", 1.0, 1e300, 1e200), ("blr", "diag-moment", 1.0, 1e3, 1e3), ("blr", "dlr", 1.0, 1e300, 1e200)]


@pytest.mark.parametrize("case", ITERATED, ids=[f"{c[0]}-{c[1]}" for c in ITERATED])
def test_iterated_steps_name_the_inner_iteration_on_every_backend(case):
    algorithm, family, lr, prior_var, y = case
    found = []
    for backend in ("numpy", "numba"):
        f = rb.Bong(MODEL, rb.Gaussian(1.0), algorithm=algorithm, family=family, estimator="lin-ef", rank=2, lr=lr,
                    n_iter=5, backend=backend)
        bel = f.init(MODEL.init_params(np.random.default_rng(0)), prior_var)
        with pytest.raises((DivergenceError, NotPositiveDefiniteError)) as info:
            f.predict_update(bel, np.ones(2), np.array([y]))
        m = re.search(r"\(inner iteration (\d) of 5\)$", str(info.value))
        assert m is not None, str(info.value)
        found.append((type(info.value), int(m.group(1))))
    assert found[0] == found[1]
    assert found[0][1] >= 2 if algorithm == "bbb" else found[0][1] == 1


def test_one_iteration_steps_do_not_name_an_iteration():
    lik = rb.Gaussian(1.0)
    for backend in ("numpy", "numba"):
        f = rb.Bong(MODEL, lik, algorithm="bog", family="diag", estimator="lin-ef", lr=1e305, backend=backend)
        bel = f.init(MODEL.init_params(np.random.default_rng(0)), 1e10)
        with pytest.raises(DivergenceError) as info:
            f.predict_update(bel, np.ones(2), np.array([1e3]))
        assert "inner iteration" not in str(info.value)


# the GPU chains (backend "cuda", in the simulator) on the setups that make them fail: the reference's types
CUDA = textwrap.dedent(
    """
    import warnings
    import numpy as np
    import refbayes as rb
    warnings.simplefilter("ignore")
    M = rb.MLP([2, 3, 1], activation="tanh")
    F = {"LoFi": lambda lik, b: rb.LoFi(M, lik, rank=2, backend=b),
         "FDEKF": lambda lik, b: rb.FDEKF(M, lik, backend=b),
         "VDEKF-paper": lambda lik, b: rb.VDEKF(M, lik, vd_mean="paper", backend=b),
         "bong-diag": lambda lik, b: rb.Bong(M, lik, family="diag", backend=b),
         "bong-dlr": lambda lik, b: rb.Bong(M, lik, family="dlr", rank=2, backend=b)}
    n = 0
    for name, make in F.items():
        for r, y, v in ((1e-300, 1e300, 1e300), (1.0, 1e200, 1e300)):
            kinds = []
            for backend in ("numpy", "cuda"):
                f = make(rb.Gaussian(r), backend)
                try:
                    f.predict_update(f.init(M.init_params(np.random.default_rng(0)), v), np.ones(2), np.array([y]))
                    kinds.append("ok")
                except (rb.DivergenceError, rb.NotPositiveDefiniteError) as exc:
                    kinds.append(type(exc).__name__)
            assert kinds[0] == kinds[1], (name, r, y, v, kinds)
            n += kinds[0] != "ok"
    print("CUDA-FAILURES-OK", n)
    """
)


@pytest.mark.cuda_script(CUDA)
def test_the_gpu_chains_fail_with_the_references_error_types_in_the_simulator():
    assert_script_prints(CUDA, "CUDA-FAILURES-OK 8")
