"""Each validation summary says, setting by setting, whether its default follows the paper's text or the
authors' code; the table is well formed and reaches the report (experiments replaced by stubs)."""

import re
from pathlib import Path

import pytest

from refbayes.validation import _write_report
from refbayes.validation import bandits as bv
from refbayes.validation import bong as bg
from refbayes.validation import lofi as lv

KEYS = {"setting", "text", "code", "follows"}
FOLLOWS = re.compile(r"(text|code|both|neither)\b")
MODULES = {"lofi": lv, "bong": bg, "bandits": bv}


@pytest.mark.parametrize("name", list(MODULES))
def test_defaults_are_well_formed(name):
    rows = MODULES[name].DEFAULTS
    assert len(rows) >= 5
    settings = [r["setting"] for r in rows]
    assert len(set(settings)) == len(settings), "a setting is listed twice"
    for r in rows:
        assert set(r) == KEYS, r
        assert all(isinstance(v, str) and v.strip() for v in r.values()), r
        m = FOLLOWS.match(r["follows"])
        assert m, f"{r['setting']}: 'follows' must start with text, code, both or neither: {r['follows']!r}"
        # a default cannot follow what the paper does not say, nor code whose behaviour is unknown
        if r["text"] == "not stated":
            assert m.group(1) not in ("text", "both"), r
        if r["code"] == "unknown":
            assert m.group(1) not in ("code", "both"), r


def _stub_lofi(monkeypatch):
    for fn in ("drift", "permuted", "diabetes", "rank_ablation"):
        monkeypatch.setattr(lv, fn, lambda *a: ({}, [], []))
    monkeypatch.setattr(lv, "digits_stationary", lambda *a: ({"hparams": {}}, [], [], None))


def _stub_bong(monkeypatch):
    for fn in ("digits_experiments", "regression", "timing", "mc_hess"):
        monkeypatch.setattr(bg, fn, lambda *a, **k: (None, [], []))


def _stub_bandits(monkeypatch):
    monkeypatch.setattr(bv, "digits_bandit", lambda *a, **k: ({}, [], []))
    monkeypatch.setattr(bv, "timing", lambda *a, **k: ({}, [], []))


@pytest.mark.parametrize("name,stub", [("lofi", _stub_lofi), ("bong", _stub_bong), ("bandits", _stub_bandits)])
def test_summary_carries_the_defaults_into_the_report(name, stub, monkeypatch, tmp_path):
    stub(monkeypatch)
    summary = MODULES[name].run(quick=True, outdir=str(tmp_path / name))
    assert summary["defaults"] == MODULES[name].DEFAULTS
    summary["seconds"] = 0.0
    text = Path(_write_report({name: summary}, str(tmp_path), quick=True)).read_text()
    assert "which one each default follows" in text
    for r in MODULES[name].DEFAULTS:
        assert any(line.startswith(f"| {r['setting']} |") for line in text.splitlines()), r["setting"]


@pytest.mark.parametrize("name", list(MODULES))
def test_docs_table_mirrors_the_defaults(name):

    text = (Path(__file__).resolve().parents[1] / "docs" / f"validation-{name}.md").read_text(encoding="utf-8")
    section = text.split("Defaults: text or code", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| setting |")]
    expected = ["| " + " | ".join(r[k] for k in ("setting", "text", "code", "follows")) + " |"
                for r in MODULES[name].DEFAULTS]
    assert rows == expected
