"""The shuffled-order option and the once-per-run fixtures of tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import (
    LONGEST_MODULES,
    data_file,
    longest_first,
    once_per_run,
    shuffled_by_module,
)

ITEMS = [f"tests/m{m}.py::test_{t}" for m in range(6) for t in range(8)]


def _module(item: str) -> str:
    return item.split("::", 1)[0]


def test_the_same_seed_gives_the_same_order_and_keeps_every_item():
    first = shuffled_by_module(ITEMS, 7, _module)
    assert first == shuffled_by_module(ITEMS, 7, _module)
    assert sorted(first) == sorted(ITEMS)
    assert first != ITEMS


def test_modules_stay_together():
    order = shuffled_by_module(ITEMS, 11, _module)
    modules = [_module(item) for item in order]
    runs = [m for i, m in enumerate(modules) if i == 0 or m != modules[i - 1]]
    assert sorted(runs) == sorted(set(modules))  # each module is one contiguous run


def test_different_seeds_give_different_orders():
    orders = {tuple(shuffled_by_module(ITEMS, seed, _module)) for seed in range(5)}
    assert len(orders) == 5


def test_missing_test_data_fails_naming_the_file():
    with pytest.raises(
        FileNotFoundError, match=r"test data missing from the repository: .*no-such\.csv"
    ):
        data_file("no-such.csv")


def test_shipped_test_data_is_found():
    assert data_file("penguins_processed.csv").endswith("tests/data/penguins_processed.csv")
    assert os.path.getsize(data_file("kubeflow", "tfjob-crd-v1.9.0.yaml")) > 0


class _Factory:
    """The part of pytest's `tmp_path_factory` that `once_per_run` uses."""

    def __init__(self, basetemp):
        basetemp.mkdir(parents=True, exist_ok=True)
        self._basetemp = basetemp

    def getbasetemp(self):
        return self._basetemp


def test_once_per_run_builds_once_for_every_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    built = []

    def build(directory):
        built.append(directory)
        with open(os.path.join(directory, "out.txt"), "w") as f:
            f.write("x")
        return {"directory": directory, "pair": (1, 2)}

    # Two workers of one run: base temporary directories side by side.
    first = once_per_run(_Factory(tmp_path / "popen-gw0"), "run", build)
    second = once_per_run(_Factory(tmp_path / "popen-gw1"), "run", build)
    assert built == [str(tmp_path / "run")]
    assert first == second == {"directory": str(tmp_path / "run"), "pair": [1, 2]}
    assert (tmp_path / "run" / "out.txt").read_text() == "x"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Long enough that the second worker asks while the first still builds.
BUILD_SECONDS = 5


def test_once_per_run_builds_once_when_two_workers_ask_together(tmp_path):
    code = textwrap.dedent(
        f"""
        import os, pathlib, sys, time
        from tests.conftest import once_per_run

        class Factory:
            def __init__(self, path):
                self.path = pathlib.Path(path)
                self.path.mkdir(parents=True, exist_ok=True)

            def getbasetemp(self):
                return self.path

        def build(directory):
            with open(os.path.join(sys.argv[1], "builds"), "a") as f:
                f.write("built\\n")
            time.sleep({BUILD_SECONDS})
            return {{"directory": directory}}

        print(once_per_run(Factory(sys.argv[2]), "run", build)["directory"])
        """
    )
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw0", "PYTHONPATH": ROOT}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), str(tmp_path / f"popen-gw{i}")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [w.communicate(timeout=120)[0].strip() for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert [w.returncode for w in workers] == [0, 0]
    assert outputs == [str(tmp_path / "run")] * 2
    assert (tmp_path / "builds").read_text() == "built\n"


def test_once_per_run_without_workers_stays_in_the_session_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = once_per_run(_Factory(tmp_path / "session"), "run", lambda d: d)
    assert result == str(tmp_path / "session" / "run")


def test_once_per_run_builds_again_after_a_failure_from_an_empty_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _Factory(tmp_path)

    def fail(directory):
        open(os.path.join(directory, "partial"), "w").close()
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        once_per_run(factory, "run", fail)
    assert once_per_run(factory, "run", lambda d: sorted(os.listdir(d))) == []


def test_longest_modules_come_first_and_the_rest_keep_their_order():
    longest, second = LONGEST_MODULES[0], LONGEST_MODULES[1]
    items = ["tests/a.py::t1", f"{second}::t1", "tests/b.py::t1", f"{longest}::t1", f"{second}::t2"]
    assert longest_first(items, _module) == [
        f"{longest}::t1",
        f"{second}::t1",
        f"{second}::t2",
        "tests/a.py::t1",
        "tests/b.py::t1",
    ]


def test_longest_modules_name_existing_modules():
    # A renamed or split module would silently lose its place in the order.
    missing = [m for m in LONGEST_MODULES if not os.path.isfile(os.path.join(ROOT, m))]
    assert missing == []
