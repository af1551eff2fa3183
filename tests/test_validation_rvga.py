"""The R-VGA validation's summary goes through the report writer (its table in the report's format)."""

from refbayes.validation import _write_report
from refbayes.validation import rvga_logistic as rv


def test_report_table_lists_each_figure_next_to_the_paper(tmp_path):
    rows = [dict(figure="fig3", paper=(25.18, 25.34, 25.37, 25.90, 26.75), measured=[25.18, 25.34, 25.37, 25.9, 26.75],
                 batch_vga=25.24, neg_log_Z=25.22),
            dict(figure="fig7_d70", paper=None, measured=[20.36, 21.65, 22.0, 27.0, 37.0], batch_vga=19.69,
                 neg_log_Z=None)]
    table = rv.report_table(rows)
    assert len(table["header"]) == 5 and all(len(r) == 5 for r in table["rows"])
    text = open(_write_report({"rvga": {"checks": [], "seconds": 1.0, "table": table}}, str(tmp_path), quick=True)).read()
    assert "| fig3 | 25.18 / 25.34 / 25.37 / 25.9 / 26.75 | 25.18 / 25.34 / 25.37 / 25.9 / 26.75 | 25.24 | 25.22 |" in text
    assert "| fig7_d70 | - | 20.36 / 21.65 / 22 / 27 / 37 | 19.69 | - |" in text


def test_run_summary_is_accepted_by_the_report(tmp_path, monkeypatch):
    # one 2-D figure only (a second or so); the summary of run() must render, not crash the report
    monkeypatch.setattr(rv, "CONFIGS", [c for c in rv.CONFIGS if c["name"] == "fig3"])
    summary = rv.run(quick=True, outdir=str(tmp_path / "rvga"))
    summary["seconds"] = 1.0
    text = open(_write_report({"rvga": summary}, str(tmp_path), quick=True)).read()
    assert "| fig3 | 25.18 / 25.34 / 25.37 / 25.9 / 26.75 |" in text
    assert [r["figure"] for r in summary["rows"]] == ["fig3"]
