"""``import refbayes`` has no heavy side effects; validation modules leave matplotlib alone."""

import subprocess
import sys

import pytest

HEAVY = ("matplotlib", "numba", "sklearn", "dask", "refbayes.bandits", "refbayes.estimator")


def _run(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_refbayes_loads_no_heavy_module():
    code = (
        "import sys, refbayes\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert _run(code) == ""


def test_bandits_is_lazy_but_public():
    code = (
        "import sys, refbayes as rb\n"
        "assert 'bandits' in rb.__all__ and 'bandits' in dir(rb)\n"
        "assert 'refbayes.bandits' not in sys.modules\n"
        "m = rb.bandits\n"
        "assert m is sys.modules['refbayes.bandits']\n"
        "from refbayes import bandits\n"
        "assert bandits is m\n"
        "print('ok')\n"
    )
    assert _run(code) == "ok"


def test_every_public_name_resolves():
    code = (
        "import refbayes as rb\n"
        "missing = [n for n in rb.__all__ if not hasattr(rb, n)]\n"
        "assert set(rb.__all__) <= set(dir(rb)), set(rb.__all__) - set(dir(rb))\n"
        "print(missing, len(rb.__all__) == len(set(rb.__all__)))\n"
    )
    assert _run(code) == "[] True"


def test_rb_tune_stays_the_function_after_importing_its_module():
    code = (
        "import refbayes.tune\n"
        "import refbayes as rb\n"
        "from refbayes import tune\n"
        "print(callable(rb.tune), callable(tune), rb.tune.__module__)\n"
    )
    assert _run(code) == "True True refbayes.tune"


def test_unknown_attribute_raises():
    import refbayes

    with pytest.raises(AttributeError, match="no_such_name"):
        refbayes.no_such_name  # noqa: B018


@pytest.mark.parametrize("mod", ["bong", "bandits", "diagonal_ekf", "lofi", "bench", "rvga_logistic"])
def test_validation_modules_do_not_touch_matplotlib_at_import(mod):
    pytest.importorskip("matplotlib")
    code = f"import sys, validation.{mod}\nprint('matplotlib' in sys.modules)\n"
    assert _run(code) == "False"


def test_plot_helper_respects_a_chosen_backend():
    pytest.importorskip("matplotlib")
    code = (
        "import matplotlib\n"
        "matplotlib.use('svg')\n"
        "from validation._mpl import pyplot\n"
        "pyplot()\n"
        "print(matplotlib.get_backend().lower())\n"
    )
    assert _run(code) == "svg"
    code = "import matplotlib\nfrom validation._mpl import pyplot\npyplot()\nprint(matplotlib.get_backend().lower())\n"
    assert _run(code) == "agg"
