"""What memory the process can still take: the host's, capped by its cgroups (v1 and v2 layouts)."""

from __future__ import annotations

import os

from components.data import memory

GIB = 2**30


def _write(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        f.write(text)
    return str(path)


def test_meminfo_available_reads_kibibytes(tmp_path):
    path = _write(
        tmp_path / "meminfo",
        "MemTotal:       24684616 kB\nMemFree:        21000000 kB\nMemAvailable:   23000000 kB\n",
    )
    assert memory.meminfo_available(path) == 23000000 * 1024
    assert memory.meminfo_available(_write(tmp_path / "other", "MemTotal: 1 kB\n")) is None
    assert memory.meminfo_available(str(tmp_path / "missing")) is None


def test_cgroup_v2_limit_counts_every_ancestor(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "kubepods" / "memory.max", str(8 * GIB))
    _write(root / "kubepods" / "memory.current", str(7 * GIB))
    _write(root / "kubepods" / "pod1" / "memory.max", "max")
    _write(root / "kubepods" / "pod1" / "memory.current", str(GIB))
    proc = _write(tmp_path / "proc_cgroup", "0::/kubepods/pod1\n")
    # The pod sets no limit of its own; its parent has 1 GiB left.
    assert memory.cgroup_headroom(proc, str(root)) == GIB


def test_cgroup_v1_memory_controller(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "memory" / "job" / "memory.limit_in_bytes", str(4 * GIB))
    _write(root / "memory" / "job" / "memory.usage_in_bytes", str(GIB))
    # v1's "no limit" is a number near 2**63, not a limit.
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    _write(root / "memory" / "memory.usage_in_bytes", str(GIB))
    proc = _write(tmp_path / "proc_cgroup", "5:cpu:/\n4:memory:/job\n0::/\n")
    assert memory.cgroup_headroom(proc, str(root)) == 3 * GIB


def test_no_limit_anywhere_is_unknown(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "unified" / "memory.max", "max")
    _write(root / "unified" / "memory.current", str(GIB))
    proc = _write(tmp_path / "proc_cgroup", "4:memory:/\n0::/\n")
    assert memory.cgroup_headroom(proc, str(root)) is None
    assert memory.cgroup_headroom(str(tmp_path / "missing"), str(root)) is None


def test_available_bytes_on_this_host_is_positive():
    # Every host this suite runs on is Linux with /proc/meminfo.
    available = memory.available_bytes()
    assert available is not None and available > 0
