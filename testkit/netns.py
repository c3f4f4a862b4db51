"""Separate network hosts on one machine: Linux network namespaces joined by veth links.

`Network(["dispatcher", "worker0", ...])` makes one namespace per host, each with its
own address on a private /24, and a switch namespace holding a bridge that every host's
veth link plugs into. The calling process's own namespace joins the network too, as the
host `LOCAL` (the trainer, in tests), through a veth link of its own: so traffic between
any two hosts crosses real interfaces, and cutting a host's link (`cut`) separates it
from every other host while its processes keep running. Processes run on a host through
`prefix(host)` (`ip netns exec <namespace>`).

Needs root (CAP_NET_ADMIN) and iproute2's `ip`; `unavailable()` says which is missing.
`close()` (or leaving the `with` block, whichever way) kills every process still in the
namespaces and deletes them: the veth links go with them. Namespaces a killed test run
left behind (their creating process gone) are removed by the next `Network`.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

# The calling process's own namespace, as a host of the network.
LOCAL = "local"
# Every namespace this harness makes is named `<PREFIX><creator pid>-<tag>-<host index>`.
PREFIX = "tfxkit-"
# Where `ip netns add` puts a namespace's handle.
NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
# Bound on one `ip` command.
IP_TIMEOUT_S = 10
# Bound on the processes of a namespace exiting after SIGKILL.
KILL_TIMEOUT_S = 10


class NetnsError(RuntimeError):
    """The network could not be made or changed; the message names the command and why."""


def unavailable() -> str:
    """Why namespaces cannot be made here ('' when they can): no root, or no `ip`."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (Debian: apt install iproute2)"
    if os.geteuid() != 0:
        return (
            f"network namespaces need root (CAP_NET_ADMIN); this process runs as uid {os.geteuid()}"
        )
    return ""


def _ip(*args: str, check: bool = True) -> str:
    command = ["ip", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(command)}` did not return within {IP_TIMEOUT_S} s") from None
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    """The names of this harness's namespaces on the machine."""
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX)]


def _joining(namespace: str, proc: str = "/proc") -> list[int]:
    """The processes still on their way into `namespace`: `ip netns exec <namespace> ...`
    before it joins (and execs its command), not yet a member of it (`_members`)."""
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:4] == [b"netns", b"exec", namespace.encode()] and argv[0].endswith(b"ip"):
            found.append(int(entry))
    return found


def _identity(path: str | int) -> tuple[int, int] | None:
    """The (device, inode) of the network namespace at `path` (a handle,
    `/proc/<pid>/ns/net` or an open descriptor of one), or None when it cannot be read
    (gone, or a process exiting)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _members(identity: tuple[int, int], proc: str = "/proc") -> list[int]:
    """The processes in the network namespace `identity`, found by their `ns/net` link,
    which needs no handle (`ip netns pids` does)."""
    found = []
    for entry in os.listdir(proc):
        if entry.isdigit() and _identity(os.path.join(proc, entry, "ns", "net")) == identity:
            found.append(int(entry))
    return found


def _delete(namespace: str) -> list[int]:
    """Deletes `namespace`'s handle, then kills what still runs in it or is joining it;
    returns the processes still there after `KILL_TIMEOUT_S` (none, normally).

    The handle goes first, so none can join after a scan that finds nothing. An
    `ip netns exec` not yet past opening the handle then fails; one past it is found, by
    its command line until it execs its command and as a member after (`setns` comes
    before the exec, so the two overlap). A scan before the handle was gone could miss
    one: just past its own exec, a process's command line reads empty for a moment.
    A process joining by `enter` checks the handle after its `setns` and fails if it is
    gone. An open descriptor holds the namespace until the scans end, so its identity is
    not reused by a namespace made meanwhile.
    """
    try:
        fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = None
    identity = _identity(fd) if fd is not None else None
    left: set[int] = set()
    try:
        _ip("netns", "delete", namespace, check=False)
    finally:
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while True:
            # Those still joining first: one that execs between the two reads is a member.
            left = set(_joining(namespace))
            if identity is not None:
                left |= set(_members(identity))
            if not left or time.monotonic() > deadline:
                break
            for pid in left:  # again each scan: a pid may be reused
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if fd is not None:
            os.close(fd)
    return sorted(left)


def remove_abandoned() -> list[str]:
    """Deletes the namespaces whose creating process is gone; returns their names."""
    gone = []
    for name in namespaces():
        creator = name[len(PREFIX) :].split("-", 1)[0]
        if creator.isdigit() and not _alive(int(creator)):
            _delete(name)
            gone.append(name)
    return gone


def enter(namespace: str) -> None:
    """Moves the calling thread (a forked task: the whole process) into `namespace`.

    Sockets made after this are on the namespace's host; TensorFlow imported
    before is unaffected, as long as it has opened no connection yet.

    Raises:
      NetnsError: the namespace was deleted meanwhile (its network closed): the
        thread joined it after `_delete`'s last scan, or could have.
    """
    fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, os.CLONE_NEWNET)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {namespace!r}")
    finally:
        os.close(fd)
    _check_entered(namespace)


def _check_entered(namespace: str) -> None:
    """Raises NetnsError unless the calling thread is in `namespace` and its handle is
    still there: then its deletion comes after this, and the scans after that find the
    thread as a member."""
    here = _identity("/proc/thread-self/ns/net")
    if _identity(os.path.join(NETNS_DIR, namespace)) != here:
        raise NetnsError(f"network namespace {namespace!r} was deleted while it was entered")


def identify(pid: int) -> str:
    """The name of the namespace process `pid` runs in ('' for the machine's own)."""
    return _ip("netns", "identify", str(pid)).strip()


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no route of this machine's namespace overlaps."""
    used = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("default", "broadcast", "local", "unreachable", "blackhole"):
            word = line.split()[1] if len(line.split()) > 1 else ""
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    rng = random.Random()
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(256)}.0/24")
        if not any(subnet.overlaps(u) for u in used if u.prefixlen > 0):
            return subnet
    raise NetnsError("no free /24 in 10.0.0.0/8 for the test network")


class Network:
    """Hosts on separate network namespaces, joined by a bridge; a context manager.

    Args:
      hosts: Host names (not `LOCAL`); each gets a namespace and an address.

    Raises:
      NetnsError: without root or `ip` (naming which), or when a command fails;
        whatever was made by then is deleted.
    """

    def __init__(self, hosts: Sequence[str]):
        problem = unavailable()
        if problem:
            raise NetnsError(f"separate network hosts cannot be made: {problem}")
        if LOCAL in hosts or len(set(hosts)) != len(hosts):
            raise NetnsError(f"host names must be distinct and not {LOCAL!r}: {list(hosts)}")
        remove_abandoned()
        self.hosts = list(hosts)
        tag = f"{random.randrange(16**4):04x}"
        self._base = f"{PREFIX}{os.getpid()}-{tag}"
        self._switch = f"{self._base}-sw"
        # Interface names hold 15 characters: `tk<tag><index><side>`.
        self._links: dict[str, tuple[str, str]] = {}
        self.namespace: dict[str, str] = {}
        self.address: dict[str, str] = {}
        self._made: list[str] = []
        self._root_links: list[str] = []
        subnet = _free_subnet()
        self.subnet = str(subnet)
        addresses = list(subnet.hosts())
        try:
            self._add_namespace(self._switch)
            _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self._switch, "link", "set", "br0", "up")
            for index, host in enumerate(self.hosts):
                namespace = f"{self._base}-{index}"
                self._add_namespace(namespace)
                self.namespace[host] = namespace
                self._plug(host, f"tk{tag}{index}", namespace, str(addresses[index]))
            self._plug(LOCAL, f"tk{tag}l", None, str(addresses[-1]))
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _plug(self, host: str, link: str, namespace: str | None, address: str) -> None:
        """A veth pair: `<link>h` on the host (its address), `<link>s` on the bridge."""
        near, far = f"{link}h", f"{link}s"
        _ip("link", "add", near, "type", "veth", "peer", "name", far)
        # Deleted by `close` if it fails before both ends have left this namespace.
        self._root_links.append(near)
        _ip("link", "set", far, "netns", self._switch)
        _ip("-n", self._switch, "link", "set", far, "master", "br0")
        _ip("-n", self._switch, "link", "set", far, "up")
        if namespace is not None:
            _ip("link", "set", near, "netns", namespace)
        where = ["-n", namespace] if namespace else []
        _ip(*where, "addr", "add", f"{address}/{self.subnet.split('/')[1]}", "dev", near)
        _ip(*where, "link", "set", near, "up")
        self._links[host] = (near, far)
        self.address[host] = address

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on `host` (empty for `LOCAL`)."""
        if host == LOCAL:
            return []
        return ["ip", "netns", "exec", self.namespace[host]]

    def cut(self, host: str) -> None:
        """Takes `host`'s link down at the bridge: no host reaches it, nor it any; it keeps running."""
        _ip("-n", self._switch, "link", "set", self._links[host][1], "down")

    def restore(self, host: str) -> None:
        """Brings `host`'s link back up."""
        _ip("-n", self._switch, "link", "set", self._links[host][1], "up")

    def close(self) -> None:
        """Kills every process left in the namespaces and deletes them (their links go too).

        Raises:
          NetnsError: a process outlived `KILL_TIMEOUT_S` after SIGKILL (named), once
            everything else is deleted.
        """
        left = {}
        for name in reversed(self._made):
            pids = _delete(name)
            if pids:
                left[name] = pids
        self._made = []
        # A pair still whole in this namespace (a failed start); gone links are no error.
        for link in self._root_links:
            _ip("link", "delete", link, check=False)
        self._root_links = []
        if left:
            raise NetnsError(f"processes outlived SIGKILL for {KILL_TIMEOUT_S} s: {left}")

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
