"""The shared patch count: installed by the outermost block, restored by its exit."""

from __future__ import annotations

import threading

import pytest

from components.compat import patching


def _recording():
    calls = []
    patch = patching.SharedPatch(lambda: calls.append("install"), lambda: calls.append("restore"))
    return patch, calls


def test_nested_blocks_install_once_and_restore_once_when_the_outermost_exits():
    patch, calls = _recording()
    with patch.active():
        with patch.active():
            assert calls == ["install"]
            assert patch.depth == 2
        assert calls == ["install"]
    assert calls == ["install", "restore"]
    assert patch.depth == 0


def test_a_block_that_raises_still_restores():
    patch, calls = _recording()
    with pytest.raises(RuntimeError, match="inside"):
        with patch.active():
            raise RuntimeError("inside")
    assert calls == ["install", "restore"]
    assert patch.depth == 0


def test_concurrent_blocks_share_one_installation():
    patch, calls = _recording()
    inside = threading.Barrier(4, timeout=30)

    def run():
        with patch.active():
            inside.wait()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert calls == ["install", "restore"]
