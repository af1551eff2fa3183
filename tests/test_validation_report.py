"""The validation report: checks hold, are explained with evidence, or fail; the report says which."""

import json
from pathlib import Path

import pytest

from refbayes.validation import _write_report
from refbayes.validation.common import check, count_statuses, explanation, run_parts


def _expl(supported, cause="setup"):
    return explanation(cause, "the stream is 100x shorter", "error 30% at 500, 20% at 1300", supported)


def test_passing_check_holds_and_never_calls_its_explanation():
    def boom():
        raise AssertionError("the ablation must not run for a claim that holds")

    c = check("a", "paper", "measured", True, explain=boom)
    assert c["status"] == "holds" and "explanation" not in c


def test_failing_check_is_explained_only_when_the_evidence_supports_it():
    assert check("a", "p", "m", False)["status"] == "fails"
    assert check("a", "p", "m", False, explain=lambda: _expl(True))["status"] == "explained"
    unsupported = check("a", "p", "m", False, explain=_expl(False))
    assert unsupported["status"] == "fails" and unsupported["explanation"]["supported"] is False
    assert check("a", "p", "m", False, explain=lambda: None)["status"] == "fails"
    assert check("a", "p", "m", False, explain=_expl(True, "open-bug"))["status"] == "fails"


def test_explanation_rejects_unknown_causes_and_empty_evidence():
    with pytest.raises(ValueError, match="cause"):
        explanation("because", "t", "e", True)
    with pytest.raises(ValueError, match="evidence"):
        explanation("setup", "t", "", True)
    with pytest.raises(TypeError, match="explanation"):
        check("a", "p", "m", False, explain=lambda: {"supported": True})


def test_counts_and_report_print_the_explanation_next_to_the_check(tmp_path):
    checks = [check("ok", "p", "m", True), check("setup one", "p", "m", False, explain=_expl(True)),
              check("bare", "p", "m", False), check("weak", "p", "m", False, explain=_expl(False)),
              {"name": "old style", "expected": "p", "measured": "m", "passed": True}]
    assert count_statuses(checks) == {"holds": 2, "explained": 1, "fails": 2}
    summaries = {"demo": {"checks": checks, "seconds": 1.5,
                          "defaults": [{"setting": "q", "text": "0", "code": "1e-4", "follows": "code"}]}}
    text = Path(_write_report(summaries, str(tmp_path), quick=True)).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| setup one |"))
    assert "explained** (setup difference): the stream is 100x shorter" in row
    assert "error 30% at 500, 20% at 1300" in row
    assert next(line for line in text.splitlines() if line.startswith("| bare |")).endswith("| **NO** |")
    weak = next(line for line in text.splitlines() if line.startswith("| weak |"))
    assert "not supported" in weak and "**NO**" in weak
    assert "| [demo](#demo) | 2 | 1 | 2 | 1.5 s |" in text
    assert "| q | 0 | 1e-4 | code |" in text


def test_run_parts_times_each_part_and_writes_the_json(tmp_path):
    parts = [("one", lambda: ({"x": 1}, [check("c", "p", "m", True)], ["f.png"])),
             ("skipped", lambda: (None, [], []))]
    out = run_parts(parts, str(tmp_path), "demo.json", extra={"mode": "quick"})
    assert [c["name"] for c in out["checks"]] == ["c"] and out["figures"] == ["f.png"]
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert saved["one"] == {"x": 1} and "skipped" not in saved and saved["mode"] == "quick"
    assert set(saved["seconds"]) == {"one", "skipped"}


def test_lofi_explanations_follow_their_numbers():
    """The explanations are computed: the same helper supports or rejects depending on the evidence."""
    import numpy as np

    from refbayes.validation import lofi

    cfg = {"n_stream": 300, "tasks": 3, "n_train": 150, "splits": 3}
    curve = lambda col: np.c_[[50, 150, 300], col, col]  # noqa: E731
    closing = {lofi.LOFI: curve([1.0, 0.6, 0.45]), lofi.SGD: curve([0.5, 0.4, 0.4])}
    widening = {lofi.LOFI: curve([1.0, 0.6, 0.6]), lofi.SGD: curve([0.5, 0.4, 0.3])}
    assert lofi._stream_gap(closing, 1, "NLL", cfg)["supported"]
    assert not lofi._stream_gap(widening, 1, "NLL", cfg)["supported"]
    summ = lambda a, b: {"A": {"final_error_per_task": a, "error_after_first_eval": 0.6},  # noqa: E731
                         "B": {"final_error_per_task": b, "error_after_first_eval": 0.5}}
    assert lofi._task_end(summ([0.1, 0.1, 0.3], [0.2, 0.2, 0.2]), "A", "B", cfg)["supported"]
    assert not lofi._task_end(summ([0.3, 0.1, 0.3], [0.2, 0.2, 0.2]), "A", "B", cfg)["supported"]
    tie = {lofi.LOFI: np.array([[0.70, 0], [0.72, 0], [0.69, 0]]), lofi.FC: np.array([[0.71, 0], [0.70, 0], [0.70, 0]])}
    far = {lofi.LOFI: np.array([[0.90, 0], [0.91, 0], [0.92, 0]]), lofi.FC: np.array([[0.70, 0], [0.70, 0], [0.71, 0]])}
    assert lofi._diabetes_tie(tie, None, 0.33, 0.33, cfg)["supported"]
    assert not lofi._diabetes_tie(far, None, 0.0, 0.33, cfg)["supported"]
