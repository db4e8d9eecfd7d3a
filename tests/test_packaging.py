"""A built wheel finds conf/ (shipped inside the package) and trains from outside the repo."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import REPO, TINY


def test_every_runner_package_is_listed_for_the_wheel():
    # pyproject lists packages by hand (conf/ is mapped into runner.conf); a package missing from
    # the list is missing from the wheel, and its command fails with an import error there
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is Python 3.11+; 3.10 is supported)
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"^packages = \[(.*?)\]", text, re.S | re.M).group(1)))
    found = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "runner").rglob("__init__.py")}
    assert found - listed == set()


@pytest.mark.slow
def test_wheel_installs_and_trains_outside_the_repo(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("deepinit-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    # The dependencies come from this environment's site-packages as a plain path (its .pth
    # files, the editable install among them, are not processed), so only the wheel provides
    # `runner`.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # PYTHONPATH emptied for pip too: a checkout on it holds deepinit.egg-info (the build above
    # writes it), which pip would take for an installed deepinit and skip the wheel
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300, env=env)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import runner; print(runner.__file__)"],
                           cwd=outside, capture_output=True, text=True, env=env, check=True)
    assert str(site) in where.stdout, where.stdout  # the wheel's copy, not the checkout
    proc = subprocess.run([str(venv / "bin" / "deepinit"), "train", *TINY, "trainer.max_updates=5",
                           "warmup.updates=2"], cwd=outside, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = list((outside / "outputs" / "runs").glob("*/result.json"))
    assert len(results) == 1 and json.loads(results[0].read_text())["status"] == "ok"
    # sweep presets travel too (conf/sweep -> sweeps/)
    assert (site / "runner" / "conf" / "train.yaml").exists()
