"""Names of the BONG-family methods as they appear in the paper's figures.

Two spellings map to the options of :class:`refbayes.filters.bong.Bong`.

Family names (``Bong(family=...)``) read like the paper's legend: ``"full"`` and ``"diag"`` are
the paper's FC and Diag (natural parameters), ``"full-moment"`` and ``"diag-moment"`` its FC_MOM
and Diag_MOM (moment parameters), and ``"dlr"``. Until 0.1 ``"full"``/``"diag"`` meant the
moment forms and ``"full-natural"``/``"diag-natural"`` the natural ones; the last two are still
accepted as deprecated aliases of ``"full"``/``"diag"`` (DeprecationWarning); see CHANGELOG.md.
The modules ``families`` and ``algorithms`` keep their own identifiers (``"full"`` = moment
there); :func:`internal_family` and :func:`public_family` translate at the API boundary.

Legend names (Jones, Chang & Murphy 2024, Figs. 1-3, 5-13):
``"{algorithm}-{family}-{curvature}_{source}"``, e.g. ``"bong-dlr10-hess_lin"``,
``"blr-diag_mom-ef_mc100"``:

==============  ======================  ==========================
field           legend                  Bong option
==============  ======================  ==========================
algorithm       bong, blr, bog, bbb     algorithm
family          fc                      family="full"
                fc_mom                  family="full-moment"
                diag                    family="diag"
                diag_mom                family="diag-moment"
                dlr{R}                  family="dlr", rank=R
curvature +     hess_lin                estimator="lin-hess"
source          ef_lin                  estimator="lin-ef"
                hess_mc{M}              estimator="mc-hess", n_samples=M
                ef_mc{M}                estimator="mc-ef", n_samples=M
==============  ======================  ==========================

Short agent names (the authors' code): ``"{fg|dg|dlrg}[-rep][-l]-{algorithm}"``,
e.g. ``"dlrg-l-bong"``: fg = full covariance, dg = diagonal, dlrg = DLR;
"-rep" = moment parameters (natural without it); "-l" = linearised
(LIN-HESS), otherwise Monte Carlo with the empirical Fisher (MC-EF, the
estimator of the paper's MC experiments). Underscores are accepted in place of
hyphens. These names carry no rank or sample count.
"""

import re
import warnings

from .._compat import user_stacklevel
from .algorithms import ALGORITHMS, supports
from .estimators import ESTIMATORS
from .families import FAMILIES as _INTERNAL_FAMILIES

__all__ = ["COMBINATIONS", "FAMILY_NAMES", "DEPRECATED_FAMILIES", "parse_name", "format_name", "LEGEND_FAMILIES",
           "SHORT_FAMILIES", "internal_family", "public_family"]

#: Public family names (``Bong(family=...)``), in the paper's legend order.
FAMILY_NAMES = ("full", "full-moment", "diag", "diag-moment", "dlr")
#: public name -> identifier in ``families`` / ``algorithms`` / the kernels
_TO_INTERNAL = {"full": "full-natural", "full-moment": "full", "diag": "diag-natural", "diag-moment": "diag",
                "dlr": "dlr"}
_TO_PUBLIC = {v: k for k, v in _TO_INTERNAL.items()}
assert set(_TO_PUBLIC) == set(_INTERNAL_FAMILIES)
#: deprecated spellings of 0.1 -> the public name with the same meaning
DEPRECATED_FAMILIES = {"full-natural": "full", "diag-natural": "diag"}


def public_family(family):
    """The public family name for ``family`` (a public name or a deprecated alias, which warns)."""
    if isinstance(family, str) and family in DEPRECATED_FAMILIES:
        new = DEPRECATED_FAMILIES[family]
        warnings.warn(f"family={family!r} is deprecated and will be removed in the next release; it is now "
                      f"spelled family={new!r} (the paper's {'FC' if new == 'full' else 'Diag'}, natural "
                      "parameters). Note family='full'/'diag' meant the moment forms until 0.1: those are "
                      "now 'full-moment'/'diag-moment' (see CHANGELOG.md)", DeprecationWarning, stacklevel=user_stacklevel())
        return new
    if not isinstance(family, str) or family not in FAMILY_NAMES:
        raise ValueError(f"family must be one of {FAMILY_NAMES}; got {family!r}")
    return family


def internal_family(family):
    """The identifier used by ``families``, ``algorithms`` and the kernels for a public family name."""
    return _TO_INTERNAL[public_family(family)]


#: The 76 defined (algorithm, family, estimator) triples, with public family names.
COMBINATIONS = tuple(
    (a, _TO_PUBLIC[f], e) for a in ALGORITHMS for f in _INTERNAL_FAMILIES for e in ESTIMATORS if supports(f, e)
)

LEGEND_FAMILIES = {"fc": "full", "fc_mom": "full-moment", "diag": "diag", "diag_mom": "diag-moment"}
_LEGEND_FROM_FAMILY = {v: k for k, v in LEGEND_FAMILIES.items()}
SHORT_FAMILIES = {"fg": "full", "fg-rep": "full-moment", "dg": "diag", "dg-rep": "diag-moment", "dlrg": "dlr"}
_SHORT_FROM_FAMILY = {v: k for k, v in SHORT_FAMILIES.items()}

_ALG = "|".join(ALGORITHMS)
_LEGEND_RE = re.compile(rf"^({_ALG})-(fc_mom|fc|diag_mom|diag|dlr(\d+))-(hess|ef)_(lin|mc(\d+))$")
_SHORT_RE = re.compile(rf"^(fg|dg|dlrg)(-rep)?(-l)?-({_ALG})$")


def parse_name(name):
    """Options dict for a legend or short name (see the module docstring).

    Returns {"algorithm", "family", "estimator"} plus "rank" for DLR legend
    names and "n_samples" for Monte Carlo legend names; "family" is a public name
    ("bong-fc-hess_lin" gives family="full", the natural-parameter FC).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string; got {type(name).__name__}")
    key = name.strip().lower()
    m = _LEGEND_RE.match(key)
    if m:
        algorithm, fam, rank, curv, source, n_samples = m.groups()
        out = {"algorithm": algorithm}
        if rank is not None:
            out["family"] = "dlr"
            out["rank"] = int(rank)
        else:
            out["family"] = LEGEND_FAMILIES[fam]
        out["estimator"] = ("lin-" if source == "lin" else "mc-") + ("hess" if curv == "hess" else "ef")
        if n_samples is not None:
            out["n_samples"] = int(n_samples)
        if not supports(_TO_INTERNAL[out["family"]], out["estimator"]):
            raise ValueError(f"name {name!r} names an undefined combination (DLR with MC-HESS)")
        return out
    m = _SHORT_RE.match(key.replace("_", "-"))
    if m:
        fam, rep, lin, algorithm = m.groups()
        fam_key = fam + (rep or "")
        if fam_key not in SHORT_FAMILIES:
            raise ValueError(f"name {name!r}: the DLR family has no moment ('-rep') form")
        return {"algorithm": algorithm, "family": SHORT_FAMILIES[fam_key], "estimator": "lin-hess" if lin else "mc-ef"}
    raise ValueError(
        f"name must look like 'bong-dlr10-hess_lin', 'blr-diag_mom-ef_mc100' or 'dlrg-l-bong'; got {name!r}"
    )


def format_name(algorithm, family, estimator, rank=None, n_samples=None, style="legend"):
    """The legend (style="legend") or short (style="short") name of a method.

    ``family`` is a public name (FAMILY_NAMES). Legend names need ``rank`` for DLR and
    ``n_samples`` for Monte Carlo estimators. Short names exist only for LIN-HESS and MC-EF.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}; got {algorithm!r}")
    family = public_family(family)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {estimator!r}")
    if not supports(_TO_INTERNAL[family], estimator):
        raise ValueError("DLR with MC-HESS is undefined")
    if style == "short":
        if estimator not in ("lin-hess", "mc-ef"):
            raise ValueError(f"short names exist only for 'lin-hess' and 'mc-ef'; got {estimator!r}")
        prefix = _SHORT_FROM_FAMILY[family]
        return f"{prefix}{'-l' if estimator == 'lin-hess' else ''}-{algorithm}"
    if style != "legend":
        raise ValueError(f"style must be 'legend' or 'short'; got {style!r}")
    if family == "dlr":
        if rank is None:
            raise ValueError("rank is required to name a DLR method")
        fam = f"dlr{int(rank)}"
    else:
        fam = _LEGEND_FROM_FAMILY[family]
    source, curv = estimator.split("-")
    if source == "mc":
        if n_samples is None:
            raise ValueError("n_samples is required to name a Monte Carlo method")
        source = f"mc{int(n_samples)}"
    return f"{algorithm}-{fam}-{curv}_{source}"
