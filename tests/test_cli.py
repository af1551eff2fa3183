"""The ``refbayes`` command line: help for every command, usage errors without tracebacks."""

import subprocess
import sys

import pytest

from refbayes.cli import COMMANDS, main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "refbayes.cli", *args], capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_command():
    out = _run("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert f"refbayes {name}" in capsys.readouterr().out


def test_unknown_experiment_is_a_usage_error_naming_the_valid_ones():
    out = _run("validate", "--only", "nonsense", "--out", "unused-folder")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "'nonsense'" in out.stderr and "lofi" in out.stderr and "bong" in out.stderr


def test_unknown_command_is_a_usage_error():
    out = _run("frobnicate")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "invalid choice" in out.stderr
