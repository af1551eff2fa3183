"""One convention for every filter class (docs/conventions.md), checked by inspection and by running them.

- constructors: ``(model, likelihood, *, hyper-parameters)``; names from one vocabulary;
- ``init(mean, prior_var=1.0)`` everywhere;
- randomness passed per call, never a Generator kept on the filter;
- ``update_batch`` is the one-step minibatch update (one observation: the same as ``update``);
- the 0.1 spellings still work for one release, with a DeprecationWarning and the same numbers.
"""

import inspect
import warnings

import numpy as np
import pytest

import refbayes as rb
from refbayes.filters.base import Filter
from refbayes.filters.bong.names import COMBINATIONS, FAMILY_NAMES, internal_family, parse_name

CLASSES = ["FullEKF", "FDEKF", "VDEKF", "LoFi", "SGDRB", "OGD", "Bong", "RVGA", "LogisticRVGA", "LogisticQKF",
           "SubspaceEKF"]

#: every hyper-parameter keyword of the filter classes, one name per concept (docs/conventions.md)
VOCABULARY = {
    # dynamics and noise
    "gamma", "q", "dynamics", "ou_mean", "ou_var", "adaptive_obs_noise",
    # belief structure
    "rank", "variant", "blocks", "cov", "family", "basis", "offset",
    # update algebra and rules
    "form", "vd_mean", "diag_update", "svd", "steady_state", "inflation", "alpha", "algorithm", "scheme",
    "symmetrize", "approx", "solver",
    # estimators and expectations
    "estimator", "expectation", "derivatives", "curvature", "quadrature", "n_nodes", "n_samples", "antithetic",
    "hess_diag", "n_probes",
    # iterations and optimisers
    "n_iter", "max_iter", "tol", "memory", "lr", "optimizer", "buffer_size", "b1", "b2", "eps",
    # execution
    "rng", "backend", "dtype",
}
#: 0.1 spellings that must not come back as parameter names
RETIRED = {"vdekf_mean", "mean_rule", "n_inner", "prior_cov", "seed", "random_state", "method"}
#: the value sets behind names shared by several classes (one meaning per name)
FORM_VALUES = ("covariance", "joseph", "information")
VD_MEAN_VALUES = ("paper", "ekf")


def _cls(name):
    return getattr(rb, name)


def _problem(name):
    """(model, likelihood, extra constructor keywords, x, y) for a small problem the class accepts."""
    if name.startswith("Logistic"):
        return rb.Linear(2, 1), rb.Bernoulli(), {}, np.array([0.3, -0.4]), 1.0
    model = rb.Linear(2, 1)
    extra = {"basis": np.eye(model.n_params)[:, :2]} if name == "SubspaceEKF" else {}
    return model, rb.Gaussian(0.5), extra, np.array([0.3, -0.4]), np.array([0.7])


def _make(name, **kw):
    model, lik, extra, x, y = _problem(name)
    return _cls(name)(model, lik, **extra, **kw), x, y


def _mean(filt):
    return np.linspace(-0.2, 0.3, filt.n_params)


def _prior_var(name, value):
    """``value``, or the default where prior_var has no role (the replay learners)."""
    return 1.0 if name in ("SGDRB", "OGD") else value


def test_every_filter_class_is_covered():
    exported = {n for n in rb.__all__ if isinstance(getattr(rb, n), type) and issubclass(getattr(rb, n), Filter)}
    assert exported == set(CLASSES)


@pytest.mark.parametrize("name", CLASSES)
def test_model_and_likelihood_first_then_keyword_only(name):
    params = list(inspect.signature(_cls(name)).parameters.values())
    assert [p.name for p in params[:2]] == ["model", "likelihood"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params[:2])
    rest = params[2:]
    assert rest, f"{name} has no hyper-parameters"
    bad = [p.name for p in rest if p.kind is not p.KEYWORD_ONLY]
    assert not bad, f"{name}: {bad} are not keyword-only"


@pytest.mark.parametrize("name", CLASSES)
def test_hyper_parameter_names_come_from_one_vocabulary(name):
    names = set(list(inspect.signature(_cls(name)).parameters)[2:])
    assert names <= VOCABULARY, f"{name}: names outside the vocabulary: {sorted(names - VOCABULARY)}"
    assert not names & RETIRED


@pytest.mark.parametrize("name", CLASSES)
def test_shared_names_keep_one_meaning(name):
    params = inspect.signature(_cls(name)).parameters
    if "form" in params:
        assert params["form"].default in FORM_VALUES
        with pytest.raises(ValueError, match="form"):
            _make(name, form="order2")
    if "vd_mean" in params:
        assert params["vd_mean"].default in VD_MEAN_VALUES
    for shared in ("gamma", "q"):  # the dynamics (absent where a learner has none: SGDRB, OGD)
        if shared in params:
            assert params[shared].default == (1.0 if shared == "gamma" else 0.0)
    if "backend" in params:
        assert params["backend"].default == "numpy"
    if "rng" in params:
        assert params["rng"].default is None  # a deprecated path; nothing is stored by default


@pytest.mark.parametrize("name", CLASSES)
def test_init_has_one_signature(name):
    sig = inspect.signature(_cls(name).init)
    assert list(sig.parameters) == ["self", "mean", "prior_var"]
    assert sig.parameters["mean"].default is inspect.Parameter.empty
    assert sig.parameters["prior_var"].default == 1.0


@pytest.mark.parametrize("name", CLASSES)
def test_init_prior_var_is_used_or_refused(name):
    filt, x, y = _make(name)
    mean = _mean(filt)
    a, b = filt.init(mean, 1.0), None
    if name in ("SGDRB", "OGD"):  # no covariance: a prior_var other than the default is an error
        with pytest.raises(ValueError, match="prior_var"):
            filt.init(mean, 0.5)
        return
    b = filt.init(mean, 0.5)
    np.testing.assert_allclose(b.marginal_variance(), 0.5 * a.marginal_variance(), rtol=1e-14)


@pytest.mark.parametrize("name", CLASSES)
def test_no_filter_keeps_a_generator(name):
    kw = {}
    if name == "Bong":
        kw = dict(estimator="mc-ef", n_samples=2)
    elif name == "RVGA":
        kw = dict(expectation="mc", n_samples=4)
    elif name == "LoFi":
        kw = dict(rank=1, variant="spherical", svd="orth")
    filt, x, y = _make(name, **kw)
    rng = np.random.default_rng(3)
    bel = filt.init(_mean(filt), 1.0)
    X, Y = np.stack([x, -x, 2 * x]), [y, y, y]
    options = {"rng": rng} if getattr(filt, "needs_rng", False) else {}
    filt.scan(bel, X, Y, **options)
    filt.predict_update(bel, x, y, **options)
    stored = [k for k, v in vars(filt).items() if isinstance(v, np.random.Generator)]
    assert not stored, f"{name} keeps a Generator in {stored}"


@pytest.mark.parametrize("name,kw", [
    ("Bong", dict(estimator="mc-ef", n_samples=3, family="diag")),
    ("RVGA", dict(expectation="mc", n_samples=4)),
    ("LoFi", dict(rank=1, variant="spherical", svd="orth")),
])
def test_randomness_is_a_call_argument_and_calls_share_no_state(name, kw):
    filt, x, y = _make(name, **kw)
    assert filt.needs_rng
    bel = filt.init(_mean(filt), 1.0)
    if name == "LoFi":  # two observations, so the column order matters
        bel = filt.update(bel, x, y)
    first = filt.update(bel, -x, y, rng=np.random.default_rng(11))
    filt.update(bel, x, y, rng=np.random.default_rng(12))  # a call in between changes nothing
    again = filt.update(bel, -x, y, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(first.mean, again.mean)
    if name != "LoFi":
        with pytest.raises(TypeError, match="rng"):
            filt.update(bel, x, y)
    with pytest.raises(TypeError, match="rng"):
        filt.update(bel, x, y, rng=11)


@pytest.mark.parametrize("name,kw", [
    ("Bong", dict(estimator="mc-ef", n_samples=3, family="diag")),
    ("RVGA", dict(expectation="mc", n_samples=4)),
    ("LoFi", dict(rank=1, variant="spherical", svd="orth")),
])
def test_a_stored_generator_is_deprecated_but_works(name, kw):
    per_call, x, y = _make(name, **kw)
    with pytest.warns(DeprecationWarning, match="rng"):
        stored, _, _ = _make(name, rng=np.random.default_rng(5), **kw)
    bel = per_call.init(_mean(per_call), 1.0)
    X = np.stack([x, -x])
    a, _ = stored.scan(bel, X, [y, y])
    b, _ = per_call.scan(bel, X, [y, y], rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a.mean, b.mean)


@pytest.mark.parametrize("name", CLASSES)
def test_update_takes_this_steps_obs_var_by_keyword(name):
    filt, x, y = _make(name)
    params = inspect.signature(filt.update).parameters
    assert list(params)[:3] == ["bel", "x", "y"]
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in list(params)[3:])
    assert "obs_var" in params
    bel = filt.init(_mean(filt), _prior_var(name, 0.7))
    if name.startswith("Logistic"):  # a Bernoulli likelihood has no noise to set
        with pytest.raises(ValueError, match="obs_var"):
            filt.update(bel, x, y, obs_var=0.2)
        return
    a = filt.update(bel, x, y, obs_var=0.2)
    b = filt.with_noise(obs_var=0.2).update(bel, x, y)
    c = filt.update(bel, x, y)
    np.testing.assert_array_equal(a.mean, b.mean)
    assert not np.allclose(a.mean, c.mean)


@pytest.mark.parametrize("name", [n for n in CLASSES if not n.startswith("Logistic")])
def test_update_batch_of_one_observation_is_update(name):
    kw = dict(rank=2) if name == "LoFi" else {}
    filt, x, y = _make(name, **kw)
    bel = filt.update(filt.init(_mean(filt), _prior_var(name, 0.7)), -x, y)
    one = filt.update(bel, x, y)
    batch = filt.update_batch(bel, x[None, :], [y])
    np.testing.assert_allclose(batch.mean, one.mean, rtol=1e-12, atol=1e-14)
    if hasattr(one, "marginal_variance"):
        np.testing.assert_allclose(batch.marginal_variance(), one.marginal_variance(), rtol=1e-12)


def test_update_batch_conditions_on_the_stacked_observations():
    # FullEKF on a linear-Gaussian model: one stacked step is the exact posterior, as N sequential steps are
    filt, x, y = _make("FullEKF")
    X = np.array([[0.3, -0.4], [1.0, 0.5], [-0.7, 0.2]])
    Y = [np.array([0.7]), np.array([-0.1]), np.array([0.4])]
    bel0 = filt.init(_mean(filt), 2.0)
    seq = bel0
    for xi, yi in zip(X, Y):
        seq = filt.update(seq, xi, yi)
    batch = filt.update_batch(bel0, X, Y)
    np.testing.assert_allclose(batch.mean, seq.mean, rtol=1e-10)
    np.testing.assert_allclose(batch.cov, seq.cov, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ["LogisticRVGA", "LogisticQKF"])
def test_logistic_row_by_row_update_has_its_own_name(name):
    filt, x, y = _make(name)
    bel = filt.init(_mean(filt), 1.0)
    X, Y = np.stack([x, -x]), [1.0, 0.0]
    seq = filt.update_sequential(bel, X, Y)
    by_hand = filt.update(filt.update(bel, X[0], Y[0]), X[1], Y[1])
    np.testing.assert_array_equal(seq.mean, by_hand.mean)
    with pytest.warns(DeprecationWarning, match="update_sequential"):
        old = filt.update_batch(bel, X, Y)
    np.testing.assert_array_equal(old.mean, seq.mean)


# ---------------------------------------------------------------------------------------------
# deprecated spellings: a warning and the same numbers


def _same_run(a, b, name):
    bel = a.init(_mean(a), _prior_var(name, 0.8))
    x, y = _problem(name)[3:]
    X = np.stack([x, -x, 0.5 * x])
    ra, _ = a.scan(bel, X, [y, y, y])
    rb_, _ = b.scan(bel, X, [y, y, y])
    np.testing.assert_array_equal(ra.mean, rb_.mean)


@pytest.mark.parametrize("name,args,kw", [
    ("LoFi", (2, "spherical"), dict(rank=2, variant="spherical")),
    ("SGDRB", (3, 0.05, "adam", 2), dict(buffer_size=3, lr=0.05, optimizer="adam", n_iter=2)),
    ("OGD", (0.05,), dict(lr=0.05)),
])
def test_positional_hyper_parameters_still_work_with_a_warning(name, args, kw):
    model, lik, _, _, _ = _problem(name)
    with pytest.warns(DeprecationWarning, match="positionally"):
        old = _cls(name)(model, lik, *args)
    new = _cls(name)(model, lik, **kw)
    _same_run(old, new, name)
    with pytest.raises(TypeError, match="multiple values"):
        with pytest.warns(DeprecationWarning):
            _cls(name)(model, lik, *args, **{next(iter(kw)): next(iter(kw.values()))})


def test_positional_subspace_basis_still_works_with_a_warning():
    model, lik, extra, _, _ = _problem("SubspaceEKF")
    offset = np.full(model.n_params, 0.1)
    with pytest.warns(DeprecationWarning, match="positionally"):
        old = rb.SubspaceEKF(model, lik, extra["basis"], offset)
    new = rb.SubspaceEKF(model, lik, basis=extra["basis"], offset=offset)
    _same_run(old, new, "SubspaceEKF")
    np.testing.assert_array_equal(new.init(None, 1.0).mean, np.zeros(2))


@pytest.mark.parametrize("name,old,new", [
    ("SGDRB", dict(n_inner=3), dict(n_iter=3)),
    ("RVGA", dict(form="order1"), dict(derivatives="order1")),
    ("Bong", dict(family="diag-natural", vdekf_mean=True), dict(family="diag", vd_mean="ekf")),
])
def test_renamed_keywords_still_work_with_a_warning(name, old, new):
    with pytest.warns(DeprecationWarning):
        a, _, _ = _make(name, **old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        b, _, _ = _make(name, **new)
    _same_run(a, b, name)


# ---------------------------------------------------------------------------------------------
# BONG family names


def test_bong_family_names_read_like_the_paper_legend():
    assert FAMILY_NAMES == ("full", "full-moment", "diag", "diag-moment", "dlr")
    for legend, family in [("fc", "full"), ("fc_mom", "full-moment"), ("diag", "diag"), ("diag_mom", "diag-moment")]:
        assert parse_name(f"bong-{legend}-hess_lin")["family"] == family
        filt = rb.Bong.from_name(rb.Linear(2, 1), rb.Gaussian(0.5), f"bong-{legend}-hess_lin")
        assert filt.family == family and filt.name == f"bong-{legend}-hess_lin"
    assert {f for _, f, _ in COMBINATIONS} == set(FAMILY_NAMES)


def test_bong_full_is_the_natural_family_which_is_the_ekf():
    # the paper's FC with LIN-HESS is the EKF (Jones et al. 2024, Prop. 4.1); FC_MOM is not
    model, lik, _, x, y = _problem("Bong")
    ekf = rb.FullEKF(model, lik)
    mean = np.array([0.2, -0.1, 0.3])
    ref = ekf.update(ekf.init(mean, 0.1), x, y)
    for family, equal in (("full", True), ("full-moment", False)):
        filt = rb.Bong(model, lik, family=family)
        got = filt.update(filt.init(mean, 0.1), x, y)
        assert np.allclose(got.mean, ref.mean, rtol=1e-10) == equal
        assert np.allclose(got.cov, ref.cov, rtol=1e-10) == equal


@pytest.mark.parametrize("old,new", [("full-natural", "full"), ("diag-natural", "diag")])
def test_bong_old_natural_spellings_are_deprecated_aliases(old, new):
    with pytest.warns(DeprecationWarning, match="full-moment"):
        a, _, _ = _make("Bong", family=old)
    b, _, _ = _make("Bong", family=new)
    assert a.family == b.family == new and internal_family(new) == old
    _same_run(a, b, "Bong")


def test_bong_unknown_family_names_every_choice():
    with pytest.raises(ValueError, match="full-moment"):
        _make("Bong", family="fc")


# ---------------------------------------------------------------------------------------------
# documentation


def test_help_of_lofi_explains_gamma_q_rank_and_the_belief():
    doc = rb.LoFi.__doc__
    for word in ("gamma", "q:", "rank:", "diag(ups) + W W^T", "(P, rank)", "keyword-only"):
        assert word in doc


@pytest.mark.parametrize("name", CLASSES)
def test_every_filter_class_documents_its_paper(name):
    doc = _cls(name).__doc__ or ""
    assert any(s in doc for s in ("eq", "Algorithm", "section", "Chang", "Lambert", "Jones")), name


def test_the_vocabulary_is_written_down():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "conventions.md").read_text()
    missing = sorted(n for n in VOCABULARY if f"`{n}`" not in text)
    assert not missing, f"docs/conventions.md does not describe {missing}"


def test_tol_defaults_are_justified():
    assert inspect.signature(rb.RVGA).parameters["tol"].default == 1e-8
    assert inspect.signature(rb.LogisticRVGA).parameters["tol"].default == 1e-12
    assert "1e-12" in rb.RVGA.__doc__ and "1e-8" in rb.LogisticRVGA.__doc__


def test_deprecation_warnings_point_at_the_callers_line():
    model, lik = rb.Linear(2, 1), rb.Gaussian(0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rb.OGD(model, lik, 0.1, n_inner=2)
        rb.Bong(model, lik, family="diag-natural", vdekf_mean=True, rng=np.random.default_rng(0))
        rb.SubspaceEKF(model, lik, np.eye(3))
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 6
    assert all(w.filename == __file__ for w in deprecations), [w.filename for w in deprecations]
