"""`testkit.netns`: hosts on network namespaces reach each other over their veth links, a cut
link separates one, and nothing is left behind on any path. Needs root and `ip`; without
them, the error names what is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from testkit import netns

needs_netns = pytest.mark.skipif(
    bool(netns.unavailable()), reason=netns.unavailable() or "available"
)

# A server that answers every connection with its host's name, until killed.
SERVE = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 5000)); s.listen()\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(sys.argv[1].encode()); c.close()\n"
)


def _ask(address: str, timeout: float = 10.0) -> str:
    """The name the server at `address` answers, asked again until `timeout`: a server
    still starting refuses, and a link just brought up may drop the first packets
    (its neighbour entry failed while it was down)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, 5000), timeout=1) as c:
                return c.recv(64).decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _ask_from(network: netns.Network, host: str, address: str) -> subprocess.CompletedProcess:
    code = f"import socket; print(socket.create_connection(({address!r}, 5000), timeout=2).recv(64).decode())"
    return subprocess.run(
        [*network.prefix(host), sys.executable, "-c", code],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def _in_child(body) -> str:
    """What `body()` returns in a forked child (which may drop root or change namespace
    without touching this process), or the error it raised, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            message = body()
        except netns.NetnsError as e:
            message = f"NetnsError: {e}"
        except BaseException as e:
            message = repr(e)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        message = f.read()
    os.waitpid(pid, 0)
    return message


@needs_netns
def test_hosts_reach_each_other_over_their_links_and_a_cut_separates_one():
    with netns.Network(["a", "b"]) as network:
        assert len(set(network.address.values())) == 3
        server = subprocess.Popen([*network.prefix("a"), sys.executable, "-c", SERVE, "a"])
        try:
            assert _ask(network.address["a"]) == "a"
            assert _ask_from(network, "b", network.address["a"]).stdout.strip() == "a"
            network.cut("a")
            with pytest.raises(OSError):
                socket.create_connection((network.address["a"], 5000), timeout=2)
            assert _ask_from(network, "b", network.address["a"]).returncode != 0
            network.restore("a")
            assert _ask(network.address["a"]) == "a"
        finally:
            server.kill()
            server.wait(timeout=10)


@needs_netns
def test_a_failing_test_leaves_no_namespace_and_no_process():
    with pytest.raises(RuntimeError, match="the test failed"):
        with netns.Network(["a"]) as network:
            made = [network.namespace["a"]]
            # Raised right after starting them: some may still be exec'ing `ip`, with no
            # command line to be found by yet; none may outlive the network.
            sleepers = [
                subprocess.Popen([*network.prefix("a"), "sleep", "600"], stderr=subprocess.DEVNULL)
                for _ in range(5)
            ]
            raise RuntimeError("the test failed")
    assert not set(made) & set(netns.namespaces())
    assert all(sleeper.wait(timeout=10) != 0 for sleeper in sleepers)
    # The links went with the namespaces.
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert f"tk{made[0].split('-')[2]}" not in links


@needs_netns
def test_namespaces_of_a_run_that_died_are_removed_by_the_next():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{netns.PREFIX}{dead.pid}-dead-sw"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        with netns.Network(["a"]):
            assert name not in netns.namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=10)


def test_without_root_the_error_names_the_permission():
    if netns.unavailable().startswith("iproute2"):
        pytest.skip(netns.unavailable())

    def drop_root_and_ask():
        if os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        netns.Network(["a"])
        return "made a network"

    message = _in_child(drop_root_and_ask)
    assert message.startswith(
        "NetnsError: separate network hosts cannot be made: network namespaces need root"
    )
    assert "uid" in message


def test_the_handle_is_deleted_before_any_scan_for_processes(monkeypatch):
    """A scan before the handle is gone could miss a process just past its exec (its
    command line reads empty for a moment) that then joins: the handle goes first."""
    calls = []
    monkeypatch.setattr(netns, "_ip", lambda *args, check=True: calls.append(args) or "")
    monkeypatch.setattr(netns, "_joining", lambda *a, **k: calls.append("scan") or [])
    monkeypatch.setattr(netns, "_members", lambda *a, **k: calls.append("scan") or [])
    assert netns._delete("tfxkit-1-gone-a") == []
    assert calls[0] == ("netns", "delete", "tfxkit-1-gone-a")
    assert "scan" in calls


def test_a_process_still_joining_a_namespace_is_found_by_its_command_line(tmp_path):
    """`ip netns exec NS cmd` before it joins NS (and execs cmd) is not yet a member of NS:
    the harness finds it by its command line, so a test failing right after starting it
    leaves nothing behind."""
    for pid, argv in (
        ("11", ["ip", "netns", "exec", "tfxkit-1-a", "sleep", "600"]),
        ("12", ["/usr/sbin/ip", "netns", "exec", "tfxkit-1-a", "python3"]),
        ("13", ["ip", "netns", "exec", "tfxkit-1-b", "sleep", "600"]),
        ("14", ["sleep", "600"]),
    ):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (tmp_path / "self").mkdir()
    assert sorted(netns._joining("tfxkit-1-a", proc=str(tmp_path))) == [11, 12]


def test_the_processes_of_a_namespace_are_found_by_its_identity(tmp_path):
    """A namespace's processes are found by the namespace their `ns/net` link names (here
    a hand-made /proc; the test below deletes a real handle)."""
    (tmp_path / "ns-a").write_text("")
    (tmp_path / "ns-b").write_text("")
    for pid, target in (("21", "ns-a"), ("22", "ns-b"), ("23", "ns-a"), ("24", None)):
        (tmp_path / pid / "ns").mkdir(parents=True)
        if target:  # 24: exiting, its link unreadable
            (tmp_path / pid / "ns" / "net").symlink_to(tmp_path / target)
    identity = netns._identity(str(tmp_path / "ns-a"))
    assert sorted(netns._members(identity, proc=str(tmp_path))) == [21, 23]
    assert netns._identity(str(tmp_path / "gone")) is None


@needs_netns
def test_a_process_in_a_namespace_is_found_after_its_handle_is_deleted():
    with netns.Network(["a"]) as network:
        name = network.namespace["a"]
        identity = netns._identity(os.path.join(netns.NETNS_DIR, name))
        sleeper = subprocess.Popen([*network.prefix("a"), "sleep", "600"])
        try:
            deadline = time.monotonic() + 10
            while sleeper.pid not in netns._members(identity) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert netns._members(identity) == [sleeper.pid]
            netns._delete(name)
            assert sleeper.wait(timeout=10) == -9
            assert name not in netns.namespaces()
        finally:
            sleeper.kill()
            sleeper.wait(timeout=10)


@needs_netns
def test_a_process_that_entered_a_namespace_deleted_meanwhile_is_told_so():
    """`enter` checks, after its `setns`, that the namespace's handle is still there: one
    deleted meanwhile may have had its last scan already, so the joiner fails instead."""
    with netns.Network(["a"]) as network:
        name = network.namespace["a"]

        def enter_then_lose_the_handle():
            netns.enter(name)
            subprocess.run(["ip", "netns", "delete", name], check=True, timeout=10)
            try:
                netns._check_entered(name)
            except netns.NetnsError as e:
                return f"entered, then: {e}"
            return "entered, then not told"

        message = _in_child(enter_then_lose_the_handle)
    assert message == f"entered, then: network namespace {name!r} was deleted while it was entered"
