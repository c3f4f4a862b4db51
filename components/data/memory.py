"""How much memory this process can still take (no TFX types).

`available_bytes` is the smaller of the host's `MemAvailable` and what every cgroup on
this process's path leaves below its limit (`cgroup_headroom`, v1 and v2), so a decision
sized by it holds inside a Kubernetes pod.
"""

from __future__ import annotations

import os

PROC_MEMINFO = "/proc/meminfo"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    # cgroup v2 writes `max` for no limit; v1 writes a huge number instead.
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if value < 2**62 else None


def meminfo_available(path: str = PROC_MEMINFO) -> int | None:
    """`MemAvailable` of the host (or VM), in bytes; None when unknown."""
    text = _read(path)
    for line in (text or "").splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024
    return None


def cgroup_headroom(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> int | None:
    """Bytes left below the tightest memory limit on this process's cgroup path; None without one.

    Every ancestor's limit counts: a pod's limit sits on its own cgroup, the
    container's (if any) on a child of it.
    """
    headroom = None
    for line in (_read(proc_cgroup) or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            # The v2 hierarchy: at the root, or under `unified` on a hybrid host.
            unified = os.path.exists(os.path.join(root, "cgroup.controllers"))
            base = root if unified else os.path.join(root, "unified")
            limit_name, usage_name = "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = (
                os.path.join(root, "memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            directory = os.path.join(base, *parts[:depth])
            limit = _int(_read(os.path.join(directory, limit_name)))
            usage = _int(_read(os.path.join(directory, usage_name)))
            if limit is None or usage is None:
                continue
            left = max(0, limit - usage)
            headroom = left if headroom is None else min(headroom, left)
    return headroom


def available_bytes() -> int | None:
    """Bytes this process can still allocate: the host's available memory, capped by its cgroups."""
    known = [v for v in (meminfo_available(), cgroup_headroom()) if v is not None]
    return min(known) if known else None
