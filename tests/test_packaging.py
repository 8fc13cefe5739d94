"""Building the package (what `pip install -e .` and `make test` do) raises no setuptools warnings: a data
folder inside webapp/ that the packages configuration does not name made setuptools print some forty lines
twice during every `make test`."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import ROOT

# setuptools' words for a folder it would leave out, and the class of every such warning
SIGNS = ("absent from the `packages` configuration", "SetuptoolsDeprecationWarning", "Package would be ignored")
BUILD = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"


def build_output(source, out) -> str:
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_building_the_package_warns_of_nothing(tmp_path):
    source = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info where it runs
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "webapp", source / "webapp", ignore=shutil.ignore_patterns("__pycache__"))
    output = build_output(source, tmp_path / "dist")
    assert not [sign for sign in SIGNS if sign in output], output[-4000:]
    assert list((tmp_path / "dist").glob("glassbox-*.whl"))
