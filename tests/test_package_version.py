"""`ibpo_lit.__version__` and `--version` report the installed distribution's version."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import ibpo_lit


def test_version_is_the_installed_distributions():
    assert ibpo_lit.__version__ == version("ibpo-lit")
    assert ibpo_lit.__version__ != "0+unknown"


def test_cli_prints_the_version():
    done = subprocess.run([sys.executable, "-m", "ibpo_lit", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"python -m ibpo_lit {ibpo_lit.__version__}"


def test_importing_the_package_loads_no_torch():
    # The judge and reward workers import `ibpo_lit.*` submodules: the package itself must stay light.
    code = "import sys, ibpo_lit; print('torch' in sys.modules, 'lightning' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
