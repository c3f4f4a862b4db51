"""The wheel installs and imports in a fresh virtual environment beside the locked dependencies."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside the fresh environment: every declared dependency that applies to
# this Python is installed at a version the declaration accepts, the packages
# come from the wheel (not the source tree), and shipped configs are inside.
_CHECK = """
import importlib.metadata as md, importlib.resources, json, sys
from packaging.requirements import Requirement
problems = []
for text in md.requires("tfxkit"):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{req.name} is not installed")
        continue
    if not req.specifier.contains(version, prereleases=True):
        problems.append(f"{req.name} {version} is outside {req.specifier}")
import components, pipelines.pipeline, pipelines.cli
configs = sorted(p.name for p in importlib.resources.files("pipelines").joinpath("configs").iterdir())
print(json.dumps({"problems": problems, "components": components.__file__, "configs": configs}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with the locked setuptools, no download.
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), ROOT],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (name,) = [n for n in os.listdir(out) if n.endswith(".whl")]
    return str(out / name)


@pytest.mark.multiprocess
def test_wheel_installs_and_imports_beside_the_locked_dependencies(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The locked dependencies, seen through a path entry (which, unlike a
    # site directory, runs none of the source tree's editable-install hooks).
    with open(os.path.join(site, "locked_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "--no-deps", wheel],
        check=True,
        timeout=300,
    )

    # Without the caller's PYTHONPATH (tests often run with the source tree on
    # it), which would shadow the installed wheel.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [python, "-c", _CHECK],
        cwd=tmp_path,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = __import__("json").loads(result.stdout.strip().splitlines()[-1])
    assert report["problems"] == []
    assert report["components"].startswith(site)
    assert {"taxi.yaml", "digits.yaml", "fashion_mnist.yaml", "tfxkit.schema.json"} <= set(
        report["configs"]
    )
    help_run = subprocess.run(
        [str(env_dir / "bin" / "tfxkit"), "--help"],
        cwd=tmp_path,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert help_run.returncode == 0 and "run" in help_run.stdout


def test_wheel_ships_the_product_packages_only(wheel):
    """The harness that tests and benchmarks share (`testkit/`: fixtures, local
    clusters, fault cases, results writing) stays out of the wheel: it reads
    the repository and runs git, which an installed package cannot."""
    with zipfile.ZipFile(wheel) as z:
        names = [name for name in z.namelist() if "/" in name]
    top = {name.split("/", 1)[0] for name in names}
    packages = {t for t in top if not t.endswith((".dist-info", ".data"))}
    assert packages == {"components", "pipelines"}, sorted(top)
    # No test-harness module inside the product packages either.
    assert not [n for n in names if "/testing/" in n or n.split("/")[-1].startswith("test_")]
