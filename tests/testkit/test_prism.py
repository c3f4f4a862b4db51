"""`testkit/prism.py`: the binary's location, the Beam args, and the EXTERNAL worker pool's
process lifecycle (a free port, a bounded start, nothing left running)."""

from __future__ import annotations

import os
import re
import socket

import pytest

from pipelines import precheck
from testkit import prism
from tests.conftest import REPO


def test_the_makefile_builds_the_release_the_product_names():
    with open(os.path.join(REPO, "Makefile")) as f:
        built = re.search(r"^PRISM_VERSION := (\S+)$", f.read(), re.M).group(1)
    assert built == precheck.PRISM_VERSION
    assert precheck.PRISM_BUILD.endswith(f"@{built}")
    assert prism.cached_location().endswith(os.path.join("prism", built, "prism"))


def test_location_is_an_executable_or_none(tmp_path, monkeypatch):
    binary = tmp_path / "prism"
    monkeypatch.setenv("TFXKIT_PRISM", str(binary))
    assert prism.location() is None
    binary.write_text("#!/bin/sh\n")
    assert prism.location() is None
    binary.chmod(0o755)
    assert prism.location() == str(binary)
    args = prism.beam_args(str(binary))
    assert args[:2] == ["--runner=PrismRunner", f"--prism_location={binary}"]


@pytest.mark.multiprocess
def test_a_worker_pool_listens_and_leaves_nothing_running(tmp_path):
    with prism.WorkerPool(str(tmp_path / "pool.log")) as pool:
        host, port = pool.address.split(":")
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        assert pool.beam_args() == [
            "--environment_type=EXTERNAL",
            f"--environment_config={pool.address}",
        ]
        pid = pool.process.pid
    assert pool.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


@pytest.mark.multiprocess
def test_a_pool_that_exits_before_listening_fails_at_once_naming_its_log(tmp_path, monkeypatch):
    # An interpreter that exits at once, as a pool that cannot import Beam would.
    monkeypatch.setattr(prism.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"exited with 1 before it listened.*pool\.log"):
        prism.WorkerPool(str(tmp_path / "pool.log"))
