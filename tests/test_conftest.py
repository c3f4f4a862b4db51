"""The shuffled-order option and the once-per-run fixtures of tests/conftest.py."""

from __future__ import annotations

import os

import pytest

from tests.conftest import (
    LONGEST_MODULES,
    longest_first,
    once_per_run,
    shared_file,
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


def test_missing_shared_data_skips_naming_the_file():
    with pytest.raises(pytest.skip.Exception, match=r"shared test data missing: .*no-such\.csv"):
        shared_file("data", "no-such.csv")


def test_present_shared_data_is_returned(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.conftest.SHARED", str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("a\n")
    assert shared_file("data", "rows.csv") == str(tmp_path / "data" / "rows.csv")


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
