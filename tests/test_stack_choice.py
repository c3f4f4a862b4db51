"""Which stack `make` picks, and what `STACK=current` says where it cannot build (.ci/stack-root.sh).

The host's answers are forced (TFXKIT_GLIBC, TFXKIT_HOST_PYTHON_VERSION, TFXKIT_DEBOOTSTRAP):
no root is built here.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, ".ci", "stack-root.sh")


def _script(*args, **env):
    return subprocess.run(
        [SCRIPT, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "glibc, python, stack, reason",
    [
        ("2.36", "3.11", "1.16", "glibc 2.36 < 2.39"),
        ("2.41", "3.13", "current", "glibc 2.41 >= 2.39"),
        ("2.39", "3.11", "current", "glibc 2.39 >= 2.39"),
        ("2.41", "3.9", "1.16", "Python 3.9 is not one of"),
        ("2.38", "3.13", "1.16", "glibc 2.38 < 2.39"),
    ],
)
def test_choice_follows_the_hosts_glibc_and_python_in_one_line(glibc, python, stack, reason):
    result = _script("choose", TFXKIT_GLIBC=glibc, TFXKIT_HOST_PYTHON_VERSION=python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == stack
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"stack: {stack} ") and reason in line


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize(
    "glibc, expected",
    [("2.36", "\n.venv/bin/python -m pytest"), ("2.41", ".ci/stack-root.sh run python -m pytest")],
)
def test_make_uses_the_chosen_stack_and_says_which_once(glibc, expected):
    result = subprocess.run(
        ["make", "-n", "-C", ROOT, "test"],
        env={
            # Not the calling make's choice: `make test STACK=...` hands STACK to
            # every make below it through MAKEFLAGS.
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("STACK", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
            },
            "TFXKIT_GLIBC": glibc,
            "TFXKIT_HOST_PYTHON_VERSION": "3.13",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout.replace(ROOT, "")
    assert len([line for line in result.stderr.splitlines() if line.startswith("stack: ")]) == 1


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_refuses_an_unknown_stack():
    result = subprocess.run(
        ["make", "-n", "-C", ROOT, "test", "STACK=2.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "STACK=current or STACK=1.16" in result.stderr


def test_no_debootstrap_is_one_sentence_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    result = _script(
        "root",
        TFXKIT_GLIBC="2.36",
        TFXKIT_STACK_CACHE=str(cache),
        TFXKIT_DEBOOTSTRAP=str(tmp_path / "no-debootstrap"),
    )
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert all(word in line for word in ("glibc", "root", "debootstrap", "STACK=1.16"))
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to nobody"
)
def test_not_root_is_one_sentence_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    os.chmod(tmp_path, 0o777)
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SCRIPT, "root"],
        env={**os.environ, "TFXKIT_GLIBC": "2.36", "TFXKIT_STACK_CACHE": str(cache), "HOME": "/"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert "not running as root" in line and "glibc" in line and "debootstrap" in line
    assert not cache.exists()
