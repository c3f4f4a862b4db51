"""The shuffled-order option of tests/conftest.py."""

from __future__ import annotations

import pytest

from tests.conftest import shared_file, shuffled_by_module

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
