"""docs/streams.md runs as written: its Python blocks, in order, in one namespace."""

import re
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[1] / "docs" / "streams.md"


def test_streams_guide_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", STREAMS.read_text(), re.S)
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    env = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/streams.md block {i + 1}", "exec"), env)
    assert env["found"].best["obs_var"] == 0.01
    assert env["res3"].log_pred[0] == 0.0  # the first observation was missing
    assert env["mean"].shape == (50, 1)
