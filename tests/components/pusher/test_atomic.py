"""Atomic push: a kill mid-copy never leaves a partial model where servers look."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components.pusher.atomic import STAGING_PREFIX, atomic_copy_model

# Enough data that the copy takes long enough to be interrupted mid-way.
NUM_FILES = 400
FILE_BYTES = 64 * 1024
# Bound on the child getting to its copy (its imports take long on two busy cores).
KILL_WAIT_SECONDS = 300


def _make_model(path, marker):
    os.makedirs(os.path.join(path, "variables"))
    for i in range(NUM_FILES):
        with open(os.path.join(path, "variables", f"shard-{i:04d}"), "wb") as f:
            f.write(marker.encode() * (FILE_BYTES // len(marker)))
    with open(os.path.join(path, "saved_model.pb"), "w") as f:
        f.write(marker)


def _tree(path):
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def _versions(base):
    return sorted(n for n in os.listdir(base) if n.isdigit())


def test_copy_is_complete_and_refuses_to_overwrite(tmp_path):
    src = tmp_path / "model"
    _make_model(str(src), "new")
    base = tmp_path / "serving"
    path = atomic_copy_model(str(src), str(base), "100")
    assert _tree(path) == _tree(str(src))
    assert os.listdir(base) == ["100"]
    with pytest.raises(FileExistsError, match=r"100 already exists; refusing to overwrite"):
        atomic_copy_model(str(src), str(base), "100")


@pytest.mark.multiprocess
def test_kill_during_push_leaves_old_model_intact_and_next_push_recovers(tmp_path):
    base = tmp_path / "serving"
    old_src = tmp_path / "old"
    _make_model(str(old_src), "old")
    atomic_copy_model(str(old_src), str(base), "100")
    old_tree = _tree(str(base / "100"))

    new_src = tmp_path / "new"
    _make_model(str(new_src), "new")
    script = textwrap.dedent(
        f"""
        from components.pusher.atomic import atomic_copy_model
        atomic_copy_model({str(new_src)!r}, {str(base)!r}, "200")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        staged = []
        while time.monotonic() < deadline and proc.poll() is None:
            staged = [n for n in os.listdir(base) if n.startswith(STAGING_PREFIX)]
            if (
                staged
                and os.path.isdir(base / staged[0] / "variables")
                and os.listdir(base / staged[0] / "variables")
            ):
                break
            time.sleep(0.005)
        assert proc.poll() is None, (
            "the copy finished before it could be interrupted; raise NUM_FILES"
        )
        assert staged, f"no staged copy within {KILL_WAIT_SECONDS} s (the child never got to copy)"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=KILL_WAIT_SECONDS)

    # Serving sees only the old, complete model; the partial copy is hidden.
    assert _versions(base) == ["100"]
    assert _tree(str(base / "100")) == old_tree
    assert any(n.startswith(STAGING_PREFIX) for n in os.listdir(base))

    path = atomic_copy_model(str(new_src), str(base), "200")
    assert _versions(base) == ["100", "200"]
    assert not any(n.startswith(STAGING_PREFIX) for n in os.listdir(base))
    assert _tree(path) == _tree(str(new_src))
    assert _tree(str(base / "100")) == old_tree
