"""A directory that fills up: a size-limited tmpfs in a private mount namespace.

`full_disk(directory, margin_kib, work)` swaps `directory` for a tmpfs with room for only
`margin_kib` KiB more, mounted in a helper process's own namespace (nothing on the host);
hosts that cannot make it raise `FullDiskUnavailable` naming what failed.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterator

# The helper: mount, copy, shrink to what is used plus the margin, report,
# then hold the namespace until its standard input closes.
_HELPER = r"""
set -eu
src=$1 mnt=$2 margin_kib=$3 fstype=$4
mount -t "$fstype" -o mode=0755 tfxkit-full-disk "$mnt"
cp -a "$src/." "$mnt/"
used=$(df -Pk "$mnt" | awk 'NR == 2 { print $3 }')
size=$((used + margin_kib))
mount -t "$fstype" -o "remount,size=${size}k" tfxkit-full-disk "$mnt"
echo "ready ${size}"
exec cat > /dev/null
"""
FSTYPE = "tmpfs"
READY_TIMEOUT_SECONDS = 60
EXIT_TIMEOUT_SECONDS = 30


class FullDiskUnavailable(RuntimeError):
    """This host cannot make a size-limited file system (the reason is the message)."""


def namespace_command() -> list[str]:
    """`unshare` with a private mount namespace (and a user namespace when not root)."""
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]


def _stop(proc: subprocess.Popen) -> str:
    """Ends the helper (closing its stdin ends `cat`) and returns its stderr."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=EXIT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=EXIT_TIMEOUT_SECONDS)
    err = proc.stderr.read() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
    return err.strip()


def _read_ready(proc: subprocess.Popen) -> str:
    """The helper's `ready` line, or '' when it exited or stayed silent too long."""
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline().strip()
        if proc.poll() is not None:
            return ""
    return ""


@contextlib.contextmanager
def full_disk(directory: str, margin_kib: int, work: str) -> Iterator[int]:
    """Replaces `directory` by a file system of its contents' size plus `margin_kib`.

    Args:
      directory: An existing directory (e.g. a component's output root).
      margin_kib: Free space left on the new file system, in KiB.
      work: A directory for the mount point and the original contents
        (kept aside until the end); not under `directory`.

    Yields:
      The file system's size in KiB.

    Raises:
      FullDiskUnavailable: before anything changed, naming what failed.
    """
    mount_point = os.path.join(work, "full-disk-mount")
    aside = os.path.join(work, "full-disk-original")
    os.makedirs(mount_point)
    namespace = namespace_command()
    command = [*namespace, "sh", "-c", _HELPER, "sh"]
    command += [directory, mount_point, str(margin_kib), FSTYPE]
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as e:
            raise FullDiskUnavailable(f"cannot start {command[0]!r}: {e}") from None
        ready = _read_ready(proc)
        if not ready.startswith("ready "):
            err = _stop(proc)
            raise FullDiskUnavailable(
                f"`{' '.join(namespace)}` then `mount -t {FSTYPE}` (a private mount namespace) "
                f"failed (exit {proc.returncode}): "
                f"{' '.join(err.split()) or f'not ready within {READY_TIMEOUT_SECONDS} s'}"
            )
        view = f"/proc/{proc.pid}/root{os.path.abspath(mount_point)}"
        try:
            os.listdir(view)
        except OSError as e:
            raise FullDiskUnavailable(
                f"the {FSTYPE} was mounted but this process cannot reach it at {view}: {e}"
            ) from None
        os.rename(directory, aside)
        os.symlink(view, directory)
        try:
            yield int(ready.split()[1])
        finally:
            os.unlink(directory)
            try:
                shutil.copytree(view, directory, symlinks=True)
            except OSError:
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(aside, directory)
                raise
            shutil.rmtree(aside)
    finally:
        if proc is not None and proc.returncode is None:
            _stop(proc)
        with contextlib.suppress(OSError):
            os.rmdir(mount_point)
